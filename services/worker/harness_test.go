package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/proclist"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// TestMain doubles as the worker program when WORKER_TEST_MAIN=1, so crash
// tests can SIGKILL a real worker process.
func TestMain(m *testing.M) {
	// The claude-code tests' runs start this binary as their MCP server.
	subagentmcp.ServeIfAskedInTest()
	if os.Getenv("WORKER_TEST_MAIN") == "1" {
		os.Exit(workerMain())
	}
	os.Exit(m.Run())
}

func workerMain() int {
	return testkit.ServiceMain(func(cfg worker.Config, log *slog.Logger) (*worker.Service, error) {
		return worker.New(cfg, worker.Deps{Logger: log})
	})
}

type harness struct {
	t    *testing.T
	srv  *natstest.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	root string
}

func newHarness(t *testing.T, pc provision.Config) *harness {
	t.Helper()
	srv := natstest.StartProvisioned(t, pc)
	nc := srv.Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, srv: srv, nc: nc, js: js, root: t.TempDir()}
}

// holdLock locks the workspace dir as a live run holds its own, until the
// test ends.
func holdLock(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
}

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// define stores a sub-agent definition and returns its revision.
func (h *harness) define(d subagent.Definition) uint64 {
	h.t.Helper()
	kv := natstest.KeyValue(h.t, h.js, lifecycle.BucketSubagents)
	b, err := json.Marshal(d)
	if err != nil {
		h.t.Fatal(err)
	}
	rev, err := kv.Put(h.t.Context(), d.Name, b)
	if err != nil {
		h.t.Fatal(err)
	}
	return rev
}

// shell defines an exec sub-agent running script with sh -c. It may
// write under the test's temporary directories (where tests keep their
// marks); the hostile suite defines its sub-agents with h.define and the
// default sandbox.
func (h *harness) shell(name, script string, mod ...func(*subagent.Definition)) uint64 {
	d := subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script},
		Sandbox: subagent.Sandbox{WritePaths: []string{os.TempDir()}}}
	for _, f := range mod {
		f(&d)
	}
	return h.define(d)
}

func (h *harness) workerConfig() worker.Config {
	// The runs keep the test's own uid (without any capability), so the
	// sub-agents of these tests can write the markers the tests leave in
	// their temporary folders; the hostile suite runs as a real root
	// worker does, mapped to an unprivileged uid.
	return worker.Config{WorkspaceRoot: h.root, Concurrency: 2, KillGrace: 500 * time.Millisecond, PullExpiry: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second, SandboxUID: sandbox.OwnUID}
}

// startWorker runs a worker in this process until the test ends.
func (h *harness) startWorker(cfg worker.Config, deps worker.Deps) *worker.Service {
	h.t.Helper()
	if deps.Conn == nil {
		deps.Conn = h.srv.Conn(h.t)
	}
	if deps.Logger == nil {
		deps.Logger = quietLogger()
	}
	svc, err := worker.New(cfg, deps)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := svc.Run(ctx); err != nil {
			h.t.Errorf("worker.Run: %v", err)
		}
	})
	h.t.Cleanup(func() { cancel(); wg.Wait() })
	return svc
}

// dispatch queues a request as the dispatcher would and returns its id.
func (h *harness) dispatch(req lifecycle.Request) string {
	h.t.Helper()
	return h.dispatchMsg(req, nil)
}

// dispatchMsg is dispatch with edit, when set, changing the work message
// before it is published.
func (h *harness) dispatchMsg(req lifecycle.Request, edit func(*nats.Msg)) string {
	h.t.Helper()
	if req.DispatchID == "" {
		req.DispatchID = lifecycle.NewID()
	}
	if req.ThreadID == "" {
		req.ThreadID = req.DispatchID
	}
	e, err := lifecycle.New(lifecycle.Source("test", "harness"), &req, lifecycle.WithTraceparent(lifecycle.NewTraceparent()))
	if err != nil {
		h.t.Fatal(err)
	}
	subj, err := lifecycle.DispatchSubject(req.Subagent)
	if err != nil {
		h.t.Fatal(err)
	}
	m, err := lifecycle.Encode(subj, e)
	if err != nil {
		h.t.Fatal(err)
	}
	if edit != nil {
		edit(m)
	}
	if _, err := h.js.PublishMsg(h.t.Context(), m); err != nil {
		h.t.Fatal(err)
	}
	return req.DispatchID
}

// publishEvent publishes a lifecycle event directly (as another service
// would) and returns its stream sequence.
func (h *harness) publishEvent(d lifecycle.Data) uint64 {
	h.t.Helper()
	_, m, err := lifecycle.Message(lifecycle.Source("test", "harness"), d)
	if err != nil {
		h.t.Fatal(err)
	}
	ack, err := h.js.PublishMsg(h.t.Context(), m)
	if err != nil {
		h.t.Fatal(err)
	}
	return ack.Sequence
}

type recorded struct {
	Event lifecycle.Event
	Data  lifecycle.Data
}

// events returns every lifecycle event of a dispatch stored so far.
func (h *harness) events(dispatchID string) []recorded {
	h.t.Helper()
	var out []recorded
	for _, m := range natstest.Stored(h.t, h.js, lifecycle.StreamLifecycle, lifecycle.LifecycleFilter("", "", dispatchID)) {
		e, d := natstest.Lifecycle(h.t, m.Headers(), m.Data())
		out = append(out, recorded{e, d})
	}
	return out
}

// terminal waits for the dispatch's terminal event and returns it.
func (h *harness) terminal(dispatchID string) recorded {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range h.events(dispatchID) {
			if l, ok := r.Data.(lifecycle.Lifecycle); ok && l.LifecycleKind().Terminal() {
				return r
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.t.Fatalf("no terminal event for %s within 60s; events: %v", dispatchID, kinds(h.events(dispatchID)))
	return recorded{}
}

// waitKind waits until the dispatch has an event of kind k.
func (h *harness) waitKind(dispatchID string, k lifecycle.Kind) {
	h.t.Helper()
	testkit.Eventually(h.t, 30*time.Second, fmt.Sprintf("a %s event for %s", k, dispatchID), func() bool {
		return slices.Contains(kinds(h.events(dispatchID)), k)
	})
}

func kinds(rs []recorded) []lifecycle.Kind {
	var ks []lifecycle.Kind
	for _, r := range rs {
		if l, ok := r.Data.(lifecycle.Lifecycle); ok {
			ks = append(ks, l.LifecycleKind())
		}
	}
	return ks
}

// assertOneTerminal fails unless exactly one terminal event exists.
func (h *harness) assertOneTerminal(dispatchID string) {
	h.t.Helper()
	n := 0
	for _, k := range kinds(h.events(dispatchID)) {
		if k.Terminal() {
			n++
		}
	}
	if n != 1 {
		h.t.Fatalf("dispatch %s has %d terminal events (%v), want exactly 1", dispatchID, n, kinds(h.events(dispatchID)))
	}
}

// workPending returns the messages left on the work queue.
func (h *harness) workPending() uint64 {
	h.t.Helper()
	return natstest.StreamInfo(h.t, h.js, lifecycle.StreamDispatch).State.Msgs
}

// waitWorkEmpty waits until every work message has been acknowledged.
func (h *harness) waitWorkEmpty() {
	h.t.Helper()
	testkit.Eventually(h.t, 15*time.Second, "the work queue to empty", func() bool { return h.workPending() == 0 })
}

func readJSONFile(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v: %s", path, err, b)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

var _ = errors.New
var _ = filepath.Join

// assertWorkspace checks that ws is attempt's own workspace of the
// dispatch: <root>/<dispatch_id>.<attempt>.<random>.
func (h *harness) assertWorkspace(ws, id string, attempt int) {
	h.t.Helper()
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(filepath.Join(h.root, id)) + `\.` + strconv.Itoa(attempt) + `\.[0-9]+$`)
	if !re.MatchString(ws) {
		h.t.Fatalf("workspace %q is not attempt %d's own workspace of %s under %s", ws, attempt, id, h.root)
	}
}

// workspaceOf returns the one workspace of the dispatch's attempt that
// exists now.
func (h *harness) workspaceOf(id string, attempt int) string {
	h.t.Helper()
	m, _ := filepath.Glob(filepath.Join(h.root, id+"."+strconv.Itoa(attempt)+".*"))
	if len(m) != 1 {
		h.t.Fatalf("workspaces of %s attempt %d: %v, want one", id, attempt, m)
	}
	return m[0]
}

// assertNoProcess fails when a process whose command line contains marker
// still runs after a few seconds. Sub-agents run in their own PID
// namespace, so the pids they see are not the host's: tests find their
// processes by a marker in argv instead.
func assertNoProcess(t *testing.T, marker string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := proclist.WithMarker(marker)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v (started by the sub-agent, marker %s) still run", pids, marker)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
