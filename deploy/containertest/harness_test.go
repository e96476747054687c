package containertest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/testcontainers/testcontainers-go"
	tcnetwork "github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/agora-dispatch/agora/internal/natstest"
	agora "github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// password is the test password of a NATS user of
// deploy/nats/permissions.conf (natstest.DeployUsers).
func password(user string) string { return "ct-" + user }

var nodeNames = [3]string{"nats-1", "nats-2", "nats-3"}

func TestMain(m *testing.M) {
	// Ryuk's image cannot be pulled on our machines; the tests clean up
	// after themselves. Inside a container (/.dockerenv) mapped ports are
	// reached on localhost.
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	if _, err := os.Stat("/.dockerenv"); err == nil && os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" {
		os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "localhost")
	}
	code := m.Run()
	imgs.remove()
	os.Exit(code)
}

// requireDocker skips the test without a healthy Docker engine, or fails
// it when AGORA_REQUIRE_DOCKER=1 (CI).
// Without AGORA_REQUIRE_DOCKER=1 they also skip under -short: they take
// minutes.
func requireDocker(t *testing.T) {
	t.Helper()
	if os.Getenv("AGORA_REQUIRE_DOCKER") != "1" {
		if testing.Short() {
			t.Skip("container tests skip under -short (set AGORA_REQUIRE_DOCKER=1 to run them)")
		}
		testcontainers.SkipIfProviderIsNotHealthy(t)
		return
	}
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		t.Fatalf("AGORA_REQUIRE_DOCKER=1 but Docker is unavailable: %v", err)
	}
	defer p.Close()
	if err := p.Health(t.Context()); err != nil {
		t.Fatalf("AGORA_REQUIRE_DOCKER=1 but Docker is unhealthy: %v", err)
	}
}

// images are built once per test run, from the repository, with a unique
// tag, and removed when the run ends.
type imageSet struct {
	once  sync.Once
	err   error
	tag   string
	built []string
}

var imgs imageSet

func (s *imageSet) name(n string) string { return "agora-ct/" + n + ":" + s.tag }

// contexts names each image's Dockerfile (relative to the repository root)
// and the binaries and empty directories its tiny build context holds.
var contexts = []struct {
	name, dockerfile string
	bins, dirs       []string
	conf             bool // deploy/nats/*.conf under nats/
}{
	{name: "nats-server", dockerfile: "deploy/images/nats-server.Dockerfile", bins: []string{"nats-server"}, dirs: []string{"data"}, conf: true},
	{name: "provision", dockerfile: "deploy/images/provision.Dockerfile", bins: []string{"provision"}},
	{name: "dispatcher", dockerfile: "deploy/images/dispatcher.Dockerfile", bins: []string{"dispatcher"}},
	{name: "router", dockerfile: "deploy/images/router.Dockerfile", bins: []string{"router"}},
	{name: "worker-test", dockerfile: "deploy/containertest/worker-test.Dockerfile", bins: []string{"worker", "agora", "agora-sandbox", "testagent"}, dirs: []string{"workspace"}},
}

func (s *imageSet) ensure(t *testing.T) {
	t.Helper()
	s.once.Do(func() { s.err = s.build(t) })
	if s.err != nil {
		t.Fatalf("building images: %v", s.err)
	}
}

func (s *imageSet) build(t *testing.T) error {
	start := time.Now()
	root, err := filepath.Abs("../..")
	if err != nil {
		return err
	}
	s.tag = fmt.Sprintf("ct%d", time.Now().UnixNano())
	work, err := os.MkdirTemp("", "agora-ct-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "bin")
	// One go build for every static binary (the build cache makes reruns cheap).
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin+"/",
		"./services/dispatcher/cmd/dispatcher", "./services/worker/cmd/worker", "./services/router/cmd/router",
		"./cmd/agora", "./cmd/agora-sandbox", "./deploy/provision", "./deploy/containertest/testagent", "github.com/nats-io/nats-server/v2")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	defer p.Close()
	for _, c := range contexts {
		dir := filepath.Join(work, c.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := copyFile(filepath.Join(root, c.dockerfile), filepath.Join(dir, "Dockerfile"), 0o644); err != nil {
			return err
		}
		for _, b := range c.bins {
			if err := os.Link(filepath.Join(bin, b), filepath.Join(dir, b)); err != nil {
				return err
			}
		}
		for _, d := range c.dirs {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				return err
			}
		}
		if c.conf {
			if err := os.MkdirAll(filepath.Join(dir, "nats"), 0o755); err != nil {
				return err
			}
			for _, f := range []string{"agora.conf", "cluster.conf", "local.conf", "permissions.conf"} {
				if err := copyFile(filepath.Join(root, "deploy/nats", f), filepath.Join(dir, "nats", f), 0o644); err != nil {
					return err
				}
			}
		}
		var log strings.Builder
		req := &testcontainers.ContainerRequest{FromDockerfile: testcontainers.FromDockerfile{
			Context: dir, Dockerfile: "Dockerfile", Repo: "agora-ct/" + c.name, Tag: s.tag,
			KeepImage: true, BuildLogWriter: &log,
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		ref, err := p.BuildImage(ctx, req)
		cancel()
		if err != nil {
			return fmt.Errorf("build %s: %w\n%s", c.name, err, log.String())
		}
		s.built = append(s.built, ref)
	}
	t.Logf("built %d images (tag %s) in %s", len(s.built), s.tag, time.Since(start).Round(time.Millisecond))
	return nil
}

func (s *imageSet) remove() {
	if len(s.built) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return
	}
	defer cli.Close()
	for _, ref := range s.built {
		_, _ = cli.ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	}
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// env is one test's deployment: three NATS nodes, provisioned at R3, and
// the services.
type env struct {
	t       *testing.T
	network string
	nodes   [3]*testcontainers.DockerContainer
	svc     map[string]*testcontainers.DockerContainer
	admin   *nats.Conn
	js      jetstream.JetStream // admin
}

func natsEnv() map[string]string {
	m := map[string]string{}
	for u, v := range natstest.DeployUsers {
		m[v] = password(u)
	}
	return m
}

// clusterURL is the in-network URL list of all three nodes for user.
func clusterURL(user string) string {
	var urls []string
	for _, n := range nodeNames {
		urls = append(urls, fmt.Sprintf("nats://%s:%s@%s:4222", user, password(user), n))
	}
	return strings.Join(urls, ",")
}

// newEnv starts the cluster, provisions it at 3 replicas, and runs the
// dispatcher, the router and two workers (worker-1, worker-2).
func newEnv(t *testing.T) *env {
	t.Helper()
	requireDocker(t)
	imgs.ensure(t)
	start := time.Now()
	ctx := t.Context()
	nw, err := tcnetwork.New(ctx)
	if err != nil {
		t.Fatalf("network: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = nw.Remove(ctx)
	})
	e := &env{t: t, network: nw.Name, svc: map[string]*testcontainers.DockerContainer{}}

	// The nodes must start together: each waits for JetStream, which needs
	// the routes to the others.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, name := range nodeNames {
		wg.Go(func() {
			env := natsEnv()
			env["NATS_SERVER_NAME"] = name
			e.nodes[i], errs[i] = e.run(name, testcontainers.ContainerRequest{
				Image: imgs.name("nats-server"), Cmd: []string{"-c", "/etc/nats/cluster.conf"}, Env: env,
				ExposedPorts: []string{"4222/tcp", "8222/tcp"},
				WaitingFor:   wait.ForHTTP("/healthz?js-enabled-only=true").WithPort("8222/tcp").WithStartupTimeout(90 * time.Second),
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("nats nodes: %v", err)
	}
	for i := range e.nodes {
		e.waitHealthy(i)
	}

	prov, err := e.run("provision", testcontainers.ContainerRequest{
		Image:      imgs.name("provision"),
		Env:        map[string]string{"AGORA_NATS_URL": clusterURL("admin"), "AGORA_PROVISION_REPLICAS": "3"},
		WaitingFor: wait.ForExit().WithExitTimeout(3 * time.Minute),
	})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	if st, err := prov.State(ctx); err != nil || st.ExitCode != 0 {
		t.Fatalf("provision exited %v (%v):\n%s", st, err, logsOf(prov))
	}

	e.admin = e.connect("admin")
	if e.js, err = jetstream.New(e.admin); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{lifecycle.StreamDispatch, lifecycle.StreamLifecycle} {
		info, err := e.stream(s).Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Replicas != 3 {
			t.Fatalf("%s has %d replicas, want 3", s, info.Config.Replicas)
		}
	}

	// The dispatcher's /healthz calls $JS.API.INFO, which permissions.conf
	// does not grant the dispatcher user: it answers 503 under these
	// permissions. Wait for its start log instead (clients retry until its
	// endpoints answer).
	e.startService("dispatcher", "dispatcher", "", map[string]string{
		"AGORA_NATS_URL": clusterURL("dispatcher"), "AGORA_NATS_INBOX_PREFIX": "_INBOX_dispatcher", "AGORA_HTTP_ADDR": ":8081", "AGORA_API_TOKENS": "ct-token",
		"AGORA_DISPATCHER_ID": "dispatcher", "AGORA_DISPATCHER_SHUTDOWN_TIMEOUT": "5s",
	})
	e.startService("router", "router", "9090", map[string]string{
		"AGORA_NATS_URL": clusterURL("router"), "AGORA_NATS_INBOX_PREFIX": "_INBOX_router", "AGORA_ROUTER_HTTP_ADDR": ":9090", "AGORA_ROUTER_ID": "router",
		"AGORA_ROUTER_TICK": "200ms", "AGORA_ROUTER_SHUTDOWN_TIMEOUT": "5s",
	})
	for _, w := range []string{"worker-1", "worker-2"} {
		e.startService(w, "worker-test", "9090", map[string]string{
			"AGORA_NATS_URL": clusterURL("worker"), "AGORA_NATS_INBOX_PREFIX": "_INBOX_worker", "AGORA_WORKER_HTTP_ADDR": ":9090", "AGORA_WORKER_ID": w,
			"AGORA_WORKER_CONCURRENCY": "4", "AGORA_WORKER_PULL_EXPIRY": "2s", "AGORA_WORKER_SHUTDOWN_TIMEOUT": "5s",
		})
	}
	t.Logf("cluster, provisioning and services up in %s", time.Since(start).Round(time.Millisecond))
	return e
}

// run starts a container on the test network under alias name.
func (e *env) run(name string, req testcontainers.ContainerRequest) (*testcontainers.DockerContainer, error) {
	req.Name = ""
	req.Networks = []string{e.network}
	req.NetworkAliases = map[string][]string{e.network: {name}}
	req.Labels = map[string]string{"agora-ct-role": name}
	c, err := testcontainers.GenericContainer(context.Background(), testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
	var dc *testcontainers.DockerContainer
	if c != nil {
		dc = c.(*testcontainers.DockerContainer)
		e.t.Cleanup(func() {
			if e.t.Failed() {
				e.t.Logf("=== %s logs:\n%s", name, logsOf(dc))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = testcontainers.TerminateContainer(dc, testcontainers.StopContext(ctx))
		})
	}
	if err != nil && dc != nil {
		err = fmt.Errorf("%w\nlogs:\n%s", err, logsOf(dc))
	}
	return dc, err
}

// startService runs a service and waits for its /healthz on port, or for
// its "started" log line when port is empty.
func (e *env) startService(name, image, port string, env map[string]string) {
	e.t.Helper()
	req := testcontainers.ContainerRequest{Image: imgs.name(image), Env: env}
	if port != "" {
		req.ExposedPorts = []string{port + "/tcp"}
		req.WaitingFor = wait.ForHTTP("/healthz").WithPort(port + "/tcp").WithStartupTimeout(60 * time.Second)
	} else {
		req.WaitingFor = wait.ForLog(name + " started").WithStartupTimeout(60 * time.Second)
	}
	c, err := e.run(name, req)
	if err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	e.svc[name] = c
}

// hostURL is the host-side URL list of the running nodes for user (host
// ports change when a node restarts).
func (e *env) hostURL(user string) string {
	var urls []string
	for _, n := range e.nodes {
		if st, err := n.State(context.Background()); err != nil || !st.Running {
			continue
		}
		host, err := n.Host(context.Background())
		if err != nil {
			continue
		}
		p, err := n.MappedPort(context.Background(), "4222/tcp")
		if err != nil {
			continue
		}
		urls = append(urls, fmt.Sprintf("nats://%s:%s@%s:%s", user, password(user), host, p.Port()))
	}
	return strings.Join(urls, ",")
}

// connect connects from the host as user. The servers advertise their
// in-network addresses, which the host cannot reach: ignore them.
func (e *env) connect(user string) *nats.Conn {
	e.t.Helper()
	nc, err := nats.Connect(e.hostURL(user), nats.Name("ct-"+user), nats.IgnoreDiscoveredServers(),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(false),
		nats.CustomInboxPrefix("_INBOX_"+user)) // as the deploy's AGORA_NATS_INBOX_PREFIX
	if err != nil {
		e.t.Fatalf("connect as %s: %v", user, err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

func (e *env) client() *agora.Client {
	e.t.Helper()
	c, err := agora.New(e.connect("client"), agora.WithTimeout(10*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) stream(name string) jetstream.Stream {
	e.t.Helper()
	var s jetstream.Stream
	var err error
	for range 20 {
		ctx, cancel := context.WithTimeout(e.t.Context(), 5*time.Second)
		s, err = e.js.Stream(ctx, name)
		cancel()
		if err == nil {
			return s
		}
		time.Sleep(500 * time.Millisecond)
	}
	e.t.Fatalf("stream %s: %v", name, err)
	return nil
}

// healthz reads a node's monitoring endpoint from the host.
func healthz(ctx context.Context, c *testcontainers.DockerContainer, query string) error {
	host, err := c.Host(ctx)
	if err != nil {
		return err
	}
	p, err := c.MappedPort(ctx, "8222/tcp")
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:%s/healthz%s", host, p.Port(), query), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	return nil
}

// waitHealthy waits for node i's plain /healthz: JetStream current, its
// streams and consumers caught up.
func (e *env) waitHealthy(i int) {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(e.t.Context(), 5*time.Second)
		err := healthz(ctx, e.nodes[i], "")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s not healthy: %v", nodeNames[i], err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// register puts a sub-agent definition, as admin.
func (e *env) register(d subagent.Definition) {
	e.t.Helper()
	if err := d.Validate(); err != nil {
		e.t.Fatal(err)
	}
	b, err := json.Marshal(d)
	if err != nil {
		e.t.Fatal(err)
	}
	kv, err := e.js.KeyValue(e.t.Context(), lifecycle.BucketSubagents)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := kv.Put(e.t.Context(), d.Name, b); err != nil {
		e.t.Fatal(err)
	}
}

// retry calls f until it succeeds or the deadline passes: the services'
// endpoints answer ErrUnavailable while they (re)start and calls time out
// while the cluster elects leaders.
func retry[T any](ctx context.Context, t *testing.T, what string, d time.Duration, f func(context.Context) (T, error)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := f(cctx)
		ccancel()
		if err == nil {
			return v
		}
		var p *agora.Problem
		if errors.As(err, &p) && p.Status >= 400 && p.Status < 500 && p.Status != 404 && p.Status != 408 && p.Status != 429 {
			t.Fatalf("%s: %v", what, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v (gave up after %s)", what, err, d)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// question waits for the one asked question of a thread.
func question(ctx context.Context, t *testing.T, c *agora.Client, threadID string) lifecycle.Question {
	t.Helper()
	return retry(ctx, t, "question of "+threadID, 90*time.Second, func(ctx context.Context) (lifecycle.Question, error) {
		qs, err := c.Questions(ctx, agora.QuestionFilter{ThreadID: threadID, Status: "asked"})
		if err != nil {
			return lifecycle.Question{}, err
		}
		if len(qs) != 1 {
			return lifecycle.Question{}, fmt.Errorf("%d asked questions", len(qs))
		}
		return qs[0], nil
	})
}

// terminals counts a thread's terminal events by kind in AGORA_LIFECYCLE
// (needs_input included).
func (e *env) terminals(threadID string) map[lifecycle.Kind]uint64 {
	e.t.Helper()
	var info *jetstream.StreamInfo
	var err error
	for range 20 {
		ctx, cancel := context.WithTimeout(e.t.Context(), 5*time.Second)
		info, err = e.stream(lifecycle.StreamLifecycle).Info(ctx, jetstream.WithSubjectFilter(lifecycle.LifecycleFilter("", threadID, "")))
		cancel()
		if err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		e.t.Fatalf("lifecycle info: %v", err)
	}
	out := map[lifecycle.Kind]uint64{}
	for subj, n := range info.State.Subjects {
		k := lifecycle.Kind(strings.Split(subj, ".")[2])
		if k.Terminal() {
			out[k] += n
		}
	}
	return out
}

// assertOneEnd checks that a thread has exactly one terminal event that is
// not needs_input, and that it is finished.
func (e *env) assertOneEnd(threadID string, needsInput uint64) {
	e.t.Helper()
	got := e.terminals(threadID)
	want := map[lifecycle.Kind]uint64{lifecycle.KindFinished: 1}
	if needsInput > 0 {
		want[lifecycle.KindNeedsInput] = needsInput
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		e.t.Errorf("thread %s terminal events %v, want %v", threadID, got, want)
	}
}

// waitWorkEmpty waits for the work queue to drain: every dispatch acked.
func (e *env) waitWorkEmpty() {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(e.t.Context(), 5*time.Second)
		info, err := e.stream(lifecycle.StreamDispatch).Info(ctx)
		cancel()
		if err == nil && info.State.Msgs == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Errorf("work queue not empty: %+v %v", info, err)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// kill sends SIGKILL to a container.
func kill(ctx context.Context, c *testcontainers.DockerContainer) error {
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.ContainerKill(ctx, c.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"})
	return err
}

func logsOf(c *testcontainers.DockerContainer) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Logs(ctx)
	if err != nil {
		return "(no logs: " + err.Error() + ")"
	}
	defer r.Close()
	var lines []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 60 {
		lines = append([]string{fmt.Sprintf("… %d lines before", len(lines)-60)}, lines[len(lines)-60:]...)
	}
	return strings.Join(lines, "\n")
}
