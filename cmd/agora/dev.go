package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

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
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/seal"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/a2aserver"
	"github.com/agora-dispatch/agora/services/auditlog"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/mcpserver"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
	"github.com/agora-dispatch/agora/stack"
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
	// settings are the services' own AGORA_* settings (loadDevSettings).
	settings devSettings
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
	workers, err := strconv.Atoi(envDefault("AGORA_WORKER_CONCURRENCY", "4"))
	if err != nil {
		workers = 4 // loadDevSettings names the variable and its value
	}
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
	// Every bad setting at once, each with its variable and value.
	var errs []error
	var err error
	if o.settings, err = loadDevSettings(); err != nil {
		errs = append(errs, err)
	}
	if o.retention < time.Second {
		errs = append(errs, fmt.Errorf("--retention / AGORA_RETENTION: %q: want a duration of at least 1s, as 168h or 7d", envDefault("AGORA_RETENTION", o.retention.String())))
	}
	if o.workers < 1 {
		errs = append(errs, fmt.Errorf("--workers %d: want at least 1", o.workers))
	}
	if err := errors.Join(errs...); err != nil {
		return err
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
	// Everything kept beside the store: the data folder's parent, or
	// temporary folders with --memory.
	store, state := "", ""
	if !o.memory {
		if store, err = filepath.Abs(o.data); err != nil {
			return err
		}
		if err := os.MkdirAll(store, 0o700); err != nil {
			return fmt.Errorf("--data %s: %w", o.data, err)
		}
		state = filepath.Dir(store)
	}
	if err := checkListenAddr("--http", o.http); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.http)
	if err != nil {
		return listenError("--http", o.http, "agora dev", err)
	}
	defer ln.Close()
	httpURL := "http://" + ln.Addr().String()
	opts, err := devStackOptions(o, state, httpURL, log)
	if err != nil {
		return err
	}
	opts.Server = natsserver.Config{Host: host, Port: port, StoreDir: store, Memory: o.memory, Token: o.natsToken}
	st, err := stack.Start(ctx, opts)
	switch {
	case errors.Is(err, stack.ErrServer):
		return fmt.Errorf("%w (is another agora dev or nats-server running? use --nats-listen)", err)
	case err != nil && ctx.Err() != nil:
		fmt.Fprintln(cmd.ErrOrStderr(), "agora dev: stopping…")
		return nil
	case err != nil:
		return err
	}
	svc.ReloadOnHangup(ctx, st.Reload)
	hs := &http.Server{Handler: st.Handler(), ReadHeaderTimeout: 5 * time.Second}
	st.Go("http", func(context.Context) error {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	printBanner(cmd, st.URL(), httpURL, store, st.DevToken())
	err = st.Wait(ctx)
	fmt.Fprintln(cmd.ErrOrStderr(), "agora dev: stopping (in-flight runs get the shutdown timeout)…")
	var stopping sync.WaitGroup
	stopping.Go(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	})
	_ = st.Close()
	stopping.Wait()
	return err
}

// devStackOptions are the services agora dev runs and their settings:
// state is the folder kept beside the data folder (empty with --memory),
// httpURL where the shared listener is reached.
func devStackOptions(o devOptions, state, httpURL string, log *slog.Logger) (stack.Options, error) {
	binDir, wsRoot := filepath.Join(os.TempDir(), "agora-dev-bin"), filepath.Join(os.TempDir(), "agora-dev-workspaces")
	if state != "" {
		binDir, wsRoot = filepath.Join(state, "bin"), filepath.Join(state, "workspaces")
	}
	// The operator's floor (docs/sandbox.md): the dispatcher and the
	// worker enforce it, and the definitions dev applies must meet it.
	floor, err := envFloor()
	if err != nil {
		return stack.Options{}, err
	}
	demo, err := demoDefinition(binDir)
	if err != nil {
		return stack.Options{}, err
	}
	if floor.ModeOrDefault() == subagent.SandboxStrict {
		demo.Sandbox.Mode = subagent.SandboxStrict // it needs no network and nothing of /etc
	}
	defs := []subagent.Definition{demo}
	if o.subagents != "" {
		more, err := loadDefinitions(o.subagents, floor)
		if err != nil {
			return stack.Options{}, err
		}
		defs = append(defs, more...)
	}
	// The HTTP API's and MCP's callers: operators' tokens, and the
	// principals file's scoped principals (docs/security.md).
	// Every service's own AGORA_* settings apply (read as their mains
	// read them), under what dev sets itself: one shared listener, its
	// ids, folders, flags and floor.
	set := o.settings
	dcfg := set.dispatcher
	dcfg.HTTPAddr, dcfg.ID, dcfg.Retention = o.http, "dev", o.retention
	dcfg.SandboxFloor, dcfg.SandboxAllowPaths, dcfg.SandboxAllowHosts = floor.Mode, floor.Paths, floor.Hosts
	if err := dcfg.Validate(); err != nil {
		return stack.Options{}, fmt.Errorf("--http: %w", err)
	}
	dcfg.HTTPAddr = "" // served on the shared listener
	wcfg := set.worker
	wcfg.Concurrency, wcfg.WorkspaceRoot, wcfg.HTTPAddr = o.workers, wsRoot, ""
	wcfg.SandboxFloor, wcfg.SandboxAllowPaths, wcfg.SandboxAllowHosts = floor.Mode, floor.Paths, floor.Hosts
	rcfg := set.router
	rcfg.RoutesFile, rcfg.ID, rcfg.Retention, rcfg.HTTPAddr = o.routes, "dev", o.retention, ""
	// The decision log (docs/audit.md): signed checkpoints when
	// AGORA_AUDIT_SIGNING_KEY_FILE names a key.
	acfg := set.audit
	acfg.HTTPAddr = ""
	// The inbox: a users file when AGORA_INBOX_USERS is set, else one dev
	// login token printed in the banner. Its public URL is announced over
	// NATS, so links the CLI prints in other shells point here whatever
	// port it is.
	icfg := inbox.Config{UsersFile: os.Getenv("AGORA_INBOX_USERS"), PublicURL: httpURL + inbox.Prefix}
	icfg.DevToken = icfg.UsersFile == ""
	// Signed answer links (/inbox/a/<token>): AGORA_ANSWER_LINK_KEY, or a
	// key kept beside the data folder (one per run with --memory).
	if icfg.LinkKey = os.Getenv("AGORA_ANSWER_LINK_KEY"); icfg.LinkKey == "" {
		if icfg.LinkKey, err = stateKey(state, "answer-link.key"); err != nil {
			return stack.Options{}, err
		}
	}
	// MCP for orchestrator agents at /mcp, with the API's tokens. Its
	// requestState key lasts as long as the data folder.
	mcfg := set.mcp
	mcfg.HTTPAddr = ""
	if mcfg.StateKey == "" && state != "" {
		if mcfg.StateKey, err = stateKey(state, "mcp-state.key"); err != nil {
			return stack.Options{}, err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	opts := stack.Options{
		Provision:  &provision.Config{Memory: o.memory, Retention: o.retention, Changed: func(what string) { log.Info("provisioned: " + what) }},
		Subagents:  defs,
		Workers:    []worker.Config{wcfg},
		Dispatcher: &dcfg,
		Router:     &rcfg,
		Audit:      &acfg,
		Inbox:      &icfg,
		MCP:        &mcfg,
		A2A:        &set.a2a,
		Logger:     log,
		Registerer: reg,
	}
	// The Slack answerer, when AGORA_SLACK_SETTINGS names a settings file
	// (docs/slack.md); its interactivity is served on the shared listener.
	if os.Getenv("AGORA_SLACK_SETTINGS") != "" {
		var scfg slackanswerer.Config
		if err := config.Load(&scfg); err != nil {
			return stack.Options{}, err
		}
		scfg.HTTPAddr = ""
		scfg.InboxURL = cmp.Or(scfg.InboxURL, httpURL+inbox.Prefix)
		opts.Slack = &scfg
	}
	return opts, nil
}

// stateKey reads a key kept in dir/name (the MCP requestState key, the
// answer link key), making it (32 random bytes, base64, mode 0600) when
// there is none. With no dir the key is new and kept nowhere.
func stateKey(dir, name string) (string, error) {
	if dir == "" {
		return seal.NewKey(), nil
	}
	path := filepath.Join(dir, name)
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
	login := inbox.LoginLink(httpURL, token)
	fmt.Fprintf(cmd.ErrOrStderr(), `
Agora dev is running.
  inbox     %s
  API       %s/v1/…   %s/healthz   %s/metrics
  NATS      %s   (other shells: export AGORA_NATS_URL=%s)
  MCP       %s/mcp   (claude mcp add --transport http agora %s/mcp)
  A2A       %s/a2a   (agent card: %s/.well-known/agent-card.json)
  data      %s

Try it (another shell):
  curl -s -XPOST %s/v1/dispatches -H 'Content-Type: application/json' -d '{"subagent":"demo","input":{"task":"rename the config loader"}}'
  then answer the demo's question in the inbox above, and watch it resume:
  curl -sN %s/v1/events
Press Ctrl-C to stop.

`, login, httpURL, httpURL, httpURL, natsURL, natsURL, httpURL, httpURL, httpURL, httpURL, where, httpURL, httpURL)
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

// devSettings are the AGORA_* settings of the services agora dev runs,
// read as each service's own main reads them (internal/config).
type devSettings struct {
	dispatcher dispatcher.Config
	worker     worker.Config
	router     router.Config
	audit      auditlog.Config
	mcp        mcpserver.Config
	a2a        a2aserver.Config
}

// loadDevSettings reads devSettings and reports every bad variable with
// its value at once, each once. AGORA_RETENTION is dev's own to read (it
// takes days, as 7d).
func loadDevSettings() (devSettings, error) {
	var s devSettings
	seen := map[string]bool{}
	var errs []error
	for _, spec := range []any{&s.dispatcher, &s.worker, &s.router, &s.audit, &s.mcp, &s.a2a} {
		err := config.Read(spec)
		if err == nil {
			continue
		}
		for _, line := range strings.Split(strings.TrimPrefix(err.Error(), "config: "), "\n") {
			if line == "" || seen[line] || strings.HasPrefix(line, "AGORA_RETENTION=") {
				continue
			}
			seen[line] = true
			errs = append(errs, errors.New(line))
		}
	}
	if len(errs) > 0 {
		return s, fmt.Errorf("config: %w", errors.Join(errs...))
	}
	return s, nil
}
