package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/answerers/inbox"
	slackanswerer "github.com/agora-dispatch/agora/answerers/slack"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/retention"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/seal"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/mcpserver"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
)

type devOptions struct {
	http       string
	natsListen string
	natsToken  string
	data       string
	memory     bool
	workers    int
	subagents  string
	routes     string
	retention  time.Duration
}

// envDefault returns the variable's value, or def.
func envDefault(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func newDevCmd() *cobra.Command {
	var o devOptions
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run everything in one process on an embedded NATS server",
		Long: `dev starts an embedded NATS server with JetStream, provisions Agora's streams
and buckets, and runs the services in one process with one HTTP listener
(/healthz, /metrics). It registers the demo sub-agent. Ctrl-C drains cleanly;
starting again on the same --data directory picks up queued work.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDev(cmd, o) },
	}
	f := cmd.Flags()
	workers, _ := strconv.Atoi(envDefault("AGORA_WORKER_CONCURRENCY", "4"))
	f.StringVar(&o.http, "http", envDefault("AGORA_HTTP_ADDR", "127.0.0.1:8080"), "HTTP listen address (AGORA_HTTP_ADDR)")
	f.StringVar(&o.natsListen, "nats-listen", envDefault("AGORA_NATS_LISTEN", "127.0.0.1:4222"), "embedded NATS listen address (AGORA_NATS_LISTEN)")
	f.StringVar(&o.natsToken, "nats-token", envDefault("AGORA_DEV_NATS_TOKEN", ""), "token every NATS client must present; required when --nats-listen is not loopback; \"generate\" makes one (AGORA_DEV_NATS_TOKEN)")
	f.StringVar(&o.data, "data", envDefault("AGORA_DATA_DIR", filepath.Join(".agora", "data")), "JetStream data directory (AGORA_DATA_DIR)")
	f.BoolVar(&o.memory, "memory", envDefault("AGORA_MEMORY", "") == "true", "keep everything in memory: a throwaway store (AGORA_MEMORY=true)")
	f.IntVar(&o.workers, "workers", workers, "worker slots (AGORA_WORKER_CONCURRENCY)")
	f.StringVar(&o.routes, "router-config", envDefault("AGORA_ROUTER_CONFIG", ""), "routing file (AGORA_ROUTER_CONFIG); default: every question goes to the route human")
	f.StringVar(&o.subagents, "subagents", envDefault("AGORA_SUBAGENTS_DIR", ""), "apply every *.yaml sub-agent definition in this directory at start (AGORA_SUBAGENTS_DIR)")
	var rerr error
	o.retention, rerr = parseRetention(envDefault("AGORA_RETENTION", retention.Default.String()))
	if rerr != nil {
		o.retention = -1 // refused at start, naming the variable
	}
	f.Var(retentionFlag{&o.retention}, "retention", "how long finished work stays readable after its thread ends, as 168h or 7d (AGORA_RETENTION)")
	return cmd
}

func runDev(cmd *cobra.Command, o devOptions) error {
	ctx := cmd.Context()
	if o.retention < time.Second {
		return fmt.Errorf("--retention / AGORA_RETENTION: %q: want a duration of at least 1s, as 168h or 7d", envDefault("AGORA_RETENTION", o.retention.String()))
	}
	log, err := logging.New(os.Stderr)
	if err != nil {
		return err
	}
	// Traces of every service, when OTEL_EXPORTER_OTLP_ENDPOINT is set
	// (docs/tracing.md).
	stopTraces, err := telemetry.Start(ctx, "agora-dev", log)
	if err != nil {
		return err
	}
	defer stopTraces()
	host, portStr, err := net.SplitHostPort(o.natsListen)
	if err != nil {
		return fmt.Errorf("--nats-listen %q: %w", o.natsListen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("--nats-listen %q: bad port", o.natsListen)
	}
	// Whoever reaches the bus can register a sub-agent and run commands on
	// this host: a listener other hosts can reach needs a token.
	if o.natsToken == "generate" {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		o.natsToken = hex.EncodeToString(b)
	}
	if !loopbackHost(host) && o.natsToken == "" {
		return fmt.Errorf("--nats-listen %s is reachable from other hosts, and whoever reaches the bus can register a sub-agent and run commands here: "+
			"set --nats-token (AGORA_DEV_NATS_TOKEN) to a secret or to \"generate\", or listen on 127.0.0.1", o.natsListen)
	}
	if o.workers < 1 {
		return fmt.Errorf("--workers %d: want at least 1", o.workers)
	}
	store := ""
	if !o.memory {
		if store, err = filepath.Abs(o.data); err != nil {
			return err
		}
		if err := os.MkdirAll(store, 0o700); err != nil {
			return fmt.Errorf("--data %s: %w", o.data, err)
		}
	}
	if err := checkListenAddr("--http", o.http); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.http)
	if err != nil {
		return listenError("--http", o.http, "agora dev", err)
	}
	defer ln.Close()
	srv, err := natsserver.Start(natsserver.Config{Host: host, Port: port, StoreDir: store, Memory: o.memory, Token: o.natsToken})
	if err != nil {
		return fmt.Errorf("embedded NATS on %s: %w (is another agora dev or nats-server running? use --nats-listen)", o.natsListen, err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	url := srv.ClientURL()
	if o.natsToken != "" {
		// What a client in another shell needs (AGORA_NATS_URL).
		url = strings.Replace(url, "nats://", "nats://"+o.natsToken+"@", 1)
	}

	nc, err := nats.Connect(url, nats.Name("agora dev"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pcfg := provision.Config{Memory: o.memory, Retention: o.retention, Changed: func(what string) { log.Info("provisioned: " + what) }}
	if err := provision.Ensure(ctx, js, pcfg); err != nil {
		return err
	}
	binDir := filepath.Join(os.TempDir(), "agora-dev-bin")
	if !o.memory {
		binDir = filepath.Join(filepath.Dir(store), "bin")
	}
	// The operator's floor (docs/sandbox.md): the dispatcher and the
	// worker enforce it, and the definitions dev applies must meet it.
	floor, err := envFloor()
	if err != nil {
		return err
	}
	demo, err := demoDefinition(binDir)
	if err != nil {
		return err
	}
	if floor.ModeOrDefault() == subagent.SandboxStrict {
		demo.Sandbox.Mode = subagent.SandboxStrict // it needs no network and nothing of /etc
	}
	defs := []subagent.Definition{demo}
	if o.subagents != "" {
		more, err := loadDefinitions(o.subagents, floor)
		if err != nil {
			return err
		}
		defs = append(defs, more...)
	}
	if err := applyDefinitions(ctx, js, defs); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	wcfg := worker.Config{Concurrency: o.workers, WorkspaceRoot: filepath.Join(os.TempDir(), "agora-dev-workspaces"),
		SandboxFloor: floor.Mode, SandboxAllowPaths: floor.Paths, SandboxAllowHosts: floor.Hosts}
	if !o.memory {
		wcfg.WorkspaceRoot = filepath.Join(filepath.Dir(store), "workspaces")
	}
	w, err := worker.New(wcfg, worker.Deps{Conn: nc, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}

	tokens := splitList(os.Getenv("AGORA_API_TOKENS"))
	dcfg := dispatcher.Config{HTTPAddr: o.http, APITokens: tokens, ID: "dev", Retention: o.retention,
		SandboxFloor: floor.Mode, SandboxAllowPaths: floor.Paths, SandboxAllowHosts: floor.Hosts}
	if err := dcfg.Validate(); err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	dcfg.HTTPAddr = "" // served on the shared listener below
	d, err := dispatcher.New(dcfg, dispatcher.Deps{Conn: nc, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	r, err := router.New(router.Config{RoutesFile: o.routes, ID: "dev"}, router.Deps{Conn: nc, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	// The inbox: a users file when AGORA_INBOX_USERS is set, else one dev
	// login token printed in the banner.
	// Announced over NATS, so links the CLI prints in other shells point
	// here whatever port it is.
	icfg := inbox.Config{UsersFile: os.Getenv("AGORA_INBOX_USERS"), PublicURL: "http://" + ln.Addr().String() + inbox.Prefix}
	icfg.DevToken = icfg.UsersFile == ""
	// Signed answer links (/inbox/a/<token>): AGORA_ANSWER_LINK_KEY, or a
	// key kept in the data folder (one per run with --memory).
	if icfg.LinkKey = os.Getenv("AGORA_ANSWER_LINK_KEY"); icfg.LinkKey == "" {
		icfg.LinkKey = seal.NewKey()
		if !o.memory {
			if icfg.LinkKey, err = stateKey(filepath.Join(filepath.Dir(store), "answer-link.key")); err != nil {
				return err
			}
		}
	}
	ib, err := inbox.New(icfg, inbox.Deps{Conn: nc, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	// MCP for orchestrator agents at /mcp, with the API's tokens. Its
	// requestState key lasts as long as the data folder.
	mcfg := mcpserver.Config{APITokens: tokens}
	if !o.memory {
		if mcfg.StateKey, err = stateKey(filepath.Join(filepath.Dir(store), "mcp-state.key")); err != nil {
			return err
		}
	}
	mc, err := client.New(nc)
	if err != nil {
		return err
	}
	ms, err := mcpserver.New(ctx, mcfg, mcpserver.Deps{Client: mc, Logger: log})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/inbox/", ib.Handler())
	mux.Handle("/mcp", ms.Handler())
	// The Slack answerer, when AGORA_SLACK_SETTINGS names a settings file
	// (docs/slack.md); its interactivity is served on this listener.
	var sa *slackanswerer.Server
	if os.Getenv("AGORA_SLACK_SETTINGS") != "" {
		var scfg slackanswerer.Config
		if err := config.Load(&scfg); err != nil {
			return err
		}
		scfg.HTTPAddr = ""
		if scfg.InboxURL == "" {
			scfg.InboxURL = "http://" + ln.Addr().String() + inbox.Prefix
		}
		if sa, err = slackanswerer.New(scfg, slackanswerer.Deps{Conn: nc, Logger: log, Registerer: reg}); err != nil {
			return err
		}
		mux.Handle("/slack/", sa.Handler())
	}
	mux.Handle("/", d.Handler()) // /v1/…, /metrics (the shared registry)
	mux.Handle("GET /healthz", healthOf(map[string]http.Handler{
		"dispatcher": d.Handler(), "worker": w.Handler(), "router": r.Handler(), "inbox": ib.Handler(),
	}, map[string]string{"inbox": "/inbox/healthz"}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	var wg sync.WaitGroup
	errs := make(chan error, 5)
	wg.Go(func() {
		if err := w.Run(ctx); err != nil {
			errs <- fmt.Errorf("worker: %w", err)
		}
	})
	wg.Go(func() {
		if err := d.Run(ctx); err != nil {
			errs <- fmt.Errorf("dispatcher: %w", err)
		}
	})
	wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			errs <- fmt.Errorf("router: %w", err)
		}
	})
	wg.Go(func() {
		if err := ib.Run(ctx); err != nil {
			errs <- fmt.Errorf("inbox: %w", err)
		}
	})
	if sa != nil {
		wg.Go(func() {
			if err := sa.Run(ctx); err != nil {
				errs <- fmt.Errorf("slack: %w", err)
			}
		})
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			if err := r.Reload(); err != nil {
				log.Error("routing file not reloaded; keeping the previous routes", "err", err)
			} else {
				log.Info("routing file reloaded")
			}
			if err := ib.ReloadUsers(); err != nil {
				log.Error("inbox users file not reloaded; keeping the previous users", "err", err)
			}
		}
	}()
	ready := make(chan struct{})
	go func() {
		<-d.Ready()
		<-r.Ready()
		<-ib.Ready()
		if sa != nil {
			<-sa.Ready()
		}
		close(ready)
	}()
	select {
	case <-ready:
		wg.Go(func() {
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("http: %w", err)
			}
		})
		printBanner(cmd, url, "http://"+ln.Addr().String(), store, ib.DevToken())
		select {
		case <-ctx.Done():
		case err = <-errs:
		}
	case err = <-errs:
	case <-ctx.Done():
	}
	fmt.Fprintln(cmd.ErrOrStderr(), "agora dev: stopping (in-flight runs get the shutdown timeout)…")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = hs.Shutdown(sctx)
	cancel()
	wg.Wait()
	return err
}

// stateKey reads a key kept in path (the MCP requestState key, the
// answer link key), making it (32 random bytes, base64, mode 0600) when
// there is none.
func stateKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("key %s: %w", path, err)
	}
	key := seal.NewKey()
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("key %s: %w", path, err)
	}
	return key, nil
}

// healthOf serves agora dev's /healthz: every service's own health
// report under "services", and 200 only when all of them say ok (503
// otherwise, naming which do not). paths maps a service to its health
// path when it is not /healthz.
func healthOf(services map[string]http.Handler, paths map[string]string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := map[string]any{}
		var down []string
		for name, h := range services {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(r.Context(), http.MethodGet, cmp.Or(paths[name], "/healthz"), nil))
			var body any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				body = map[string]any{"status": "unavailable", "error": strings.TrimSpace(rec.Body.String())}
			}
			out[name] = body
			if rec.Code != http.StatusOK {
				down = append(down, name)
			}
		}
		code, status := http.StatusOK, "ok"
		if len(down) > 0 {
			slices.Sort(down)
			code, status = http.StatusServiceUnavailable, "unavailable: "+strings.Join(down, ", ")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "services": out})
	})
}

// loopbackHost reports whether a listen host is reachable only from this
// machine.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func printBanner(cmd *cobra.Command, natsURL, httpURL, store, token string) {
	where := "in memory (gone when this process ends)"
	if store != "" {
		where = store
	}
	login := httpURL + "/inbox/"
	if token != "" {
		login = httpURL + "/inbox/login?token=" + token
	}
	fmt.Fprintf(cmd.ErrOrStderr(), `
Agora dev is running.
  inbox     %s
  API       %s/v1/…   %s/healthz   %s/metrics
  NATS      %s   (other shells: export AGORA_NATS_URL=%s)
  MCP       %s/mcp   (claude mcp add --transport http agora %s/mcp)
  data      %s

Try it (another shell):
  curl -s -XPOST %s/v1/dispatches -H 'Content-Type: application/json' -d '{"subagent":"demo","input":{"task":"rename the config loader"}}'
  then answer the demo's question in the inbox above, and watch it resume:
  curl -sN %s/v1/events
Press Ctrl-C to stop.

`, login, httpURL, httpURL, httpURL, natsURL, natsURL, httpURL, httpURL, where, httpURL, httpURL)
}

// loadDefinitions parses every *.yaml definition in dir, refusing those
// that are invalid or below the operator's floor (naming the setting).
func loadDefinitions(dir string, floor subagent.Floor) ([]subagent.Definition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var defs []subagent.Definition
	var errs []error
	for _, f := range files {
		d, _, err := subagent.ParseFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		if err := d.Sandbox.CheckFloor(floor); err != nil {
			errs = append(errs, fmt.Errorf("%s: sub-agent %s is below the operator's sandbox floor: %w", f, d.Name, err))
			continue
		}
		defs = append(defs, d)
	}
	return defs, errors.Join(errs...)
}

// applyDefinitions registers definitions through the client, which
// writes only those that changed (so revisions stay meaningful).
func applyDefinitions(ctx context.Context, js jetstream.JetStream, defs []subagent.Definition) error {
	c, err := client.New(js.Conn())
	if err != nil {
		return err
	}
	for _, d := range defs {
		if _, err := c.ApplySubagent(ctx, d); err != nil {
			return fmt.Errorf("sub-agent %s: %w", d.Name, err)
		}
	}
	return nil
}

// splitList splits a comma-separated setting, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
