// Package bench measures Agora against a raw JetStream baseline in the same
// run, on one embedded server with file storage, and prints a table of
// figures with each Agora figure's ratio to the baseline. It backs
// `agora bench` and `make bench`; nothing here asserts timings.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/worker"
	"github.com/agora-dispatch/agora/stack"
)

// Config sets the size of a run.
type Config struct {
	Serial      int // round trips measured one at a time for p50/p99
	Throughput  int // messages for the throughput figure
	Concurrency int // concurrent handlers (baseline) and worker slots (Agora)
	Quick       bool
	// WorkspaceRoot is where the workers make workspaces (default: a
	// temporary directory), to compare file systems.
	WorkspaceRoot string
	// Breakdown prints the traced row's per-stage timings (its spans).
	Breakdown bool
	// NoExec leaves out what runs processes: the fork/exec baseline, the
	// exec rows and the sandbox's layers (for comparing the message path
	// alone, e.g. two builds one after the other).
	NoExec bool
	// Deadline bounds the whole run; default 5 minutes and 50 ms for each
	// of Serial and Throughput. A dispatch that ends failed or cancelled
	// stops it sooner.
	Deadline time.Duration
}

func (c Config) withDefaults() Config {
	if c.Quick {
		c.Serial, c.Throughput = max(c.Serial, 0), max(c.Throughput, 0)
		if c.Serial == 0 {
			c.Serial = 200
		}
		if c.Throughput == 0 {
			c.Throughput = 1000
		}
	}
	if c.Serial == 0 {
		c.Serial = 1000
	}
	if c.Throughput == 0 {
		c.Throughput = 5000
	}
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.Deadline <= 0 {
		c.Deadline = 5*time.Minute + time.Duration(c.Serial+c.Throughput)*50*time.Millisecond
	}
	return c
}

// Row is one measured figure.
type Row struct {
	Scenario  string  `json:"scenario"`
	P50MS     float64 `json:"p50_ms"`
	P99MS     float64 `json:"p99_ms"`
	PerSecond float64 `json:"per_second"`
	P50Ratio  float64 `json:"p50_ratio,omitempty"` // to its baseline's p50
	RateRatio float64 `json:"rate_ratio,omitempty"`
	// Baseline names the raw row the ratios compare with; empty for a
	// baseline row itself.
	Baseline   string `json:"baseline,omitempty"`
	baseline   int    // index of that row
	Serial     int    `json:"serial_samples"`
	Throughput int    `json:"throughput_messages"`
	// PeakRSSMiB is the process's peak resident memory while the row was
	// set up and measured (the embedded server included).
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// CPUMS is the CPU time the throughput run took per round trip: this
	// process (the embedded server, the services and the bench's own
	// clients) and the child processes it waited for (the exec rows'
	// launchers), user and system.
	CPUMS float64 `json:"cpu_ms_per_round_trip"`
}

// Report is a whole run.
type Report struct {
	Rows        []Row   `json:"rows"`
	Concurrency int     `json:"concurrency"`
	PeakRSSMiB  float64 `json:"peak_rss_mib"`
	// WorkspaceRoot is where the workers made workspaces.
	WorkspaceRoot string `json:"workspace_root"`
	// Launcher and SandboxMode say how exec runtimes were started
	// (internal/sandbox): the launcher binary and its containment mode.
	Launcher    string `json:"launcher"`
	SandboxMode string `json:"sandbox_mode"`
	GoVersion   string `json:"-"`
	// Artifacts are the upload throughput rows: a raw object-store put and
	// the worker path with one artifact per dispatch, same size, same run.
	Artifacts []ArtifactRow `json:"artifacts"`
	// Layers are the sandbox's layers added one at a time, the launcher
	// alone (layers.go).
	Layers []LayerRow `json:"sandbox_layers"`
	// TracedSpans is how many spans the traced row exported, Stages the
	// per-stage timings they give (printed with Breakdown).
	TracedSpans int     `json:"traced_spans"`
	Stages      []Stage `json:"stages"`
	// ResumeStages are the stages of the resume row's path measured again
	// with tracing on: every span each answer caused (only with
	// Breakdown).
	ResumeStages []Stage `json:"resume_stages,omitempty"`
	breakdown    bool
}

// ArtifactRow is one artifact upload figure.
type ArtifactRow struct {
	Scenario     string  `json:"scenario"`
	MiBPerSecond float64 `json:"mib_per_second"`
	Ratio        float64 `json:"ratio,omitempty"` // to the raw put
	SizeMiB      int     `json:"size_mib"`
	Samples      int     `json:"samples"`
	PeakRSSMiB   float64 `json:"peak_rss_mib"` // as Row's
}

// Scenario is one path measured end to end: Setup prepares it, Do runs one
// round trip identified by id and returns when its end was observed.
type scenario struct {
	name string
	do   func(ctx context.Context, id string) error
	// phase, when set, is told as measure starts each phase.
	phase func(name string)
}

// The phases of measure.
const (
	phaseSerial     = "serial"
	phaseThroughput = "throughput"
)

// Run measures every scenario and returns the report, or an error naming
// every dispatch that ended failed or cancelled.
func Run(ctx context.Context, cfg Config, progress io.Writer) (Report, error) {
	cfg = cfg.withDefaults()
	return bounded(ctx, "agora bench", cfg.Deadline, func(ctx context.Context, l *lost) (Report, error) {
		return run(ctx, cfg, l, progress)
	})
}

func run(ctx context.Context, cfg Config, l *lost, progress io.Writer) (Report, error) {
	dir, err := os.MkdirTemp("", "agora-bench-")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(dir)
	// The server only: each scenario runs the services it measures.
	st, err := stack.Start(ctx, stack.Options{Server: natsserver.Config{Port: -1, StoreDir: dir}, Provision: &provision.Config{}})
	if err != nil {
		return Report{}, err
	}
	defer st.Close()
	url, nc, js := st.URL(), st.Conn(), st.JetStream()
	say := sayer(progress)
	unwatch, err := l.watch(nc)
	if err != nil {
		return Report{}, err
	}
	defer unwatch()

	rep := Report{Concurrency: cfg.Concurrency}
	wsRoot := dir
	if cfg.WorkspaceRoot != "" {
		if wsRoot, err = os.MkdirTemp(cfg.WorkspaceRoot, "agora-bench-ws-"); err != nil {
			return Report{}, err
		}
		defer os.RemoveAll(wsRoot)
	}
	rep.WorkspaceRoot = wsRoot
	if l, err := sandbox.New(sandbox.Options{}); err == nil {
		rep.Launcher, rep.SandboxMode = l.Executable(), string(l.Mode())
	}
	// Two raw baselines: the no-op rows compare with the first, the exec
	// rows with the second, which forks and execs /bin/true in the handler
	// (the physical floor of running a process per message).
	var mem peaks
	for i, withExec := range []bool{false, true} {
		if withExec && cfg.NoExec {
			// The exec rows are left out too: their baseline index is
			// never read.
			continue
		}
		peak := mem.window()
		base, stopBase, err := baseline(ctx, nc, js, cfg.Concurrency, withExec)
		if err != nil {
			return Report{}, err
		}
		say("measuring %s", base.name)
		row, err := measure(ctx, base, cfg)
		stopBase()
		if err != nil {
			return Report{}, err
		}
		row.baseline, row.PeakRSSMiB = i, peak()
		rep.Rows = append(rep.Rows, row)
	}

	for _, rt := range []struct {
		name, runtime string
		door          door
		baseline      int
	}{
		{"agora worker path (dispatch message → worker), no-op runtime", "noop", doorWork, 0},
		{"agora end to end (request → dispatcher → worker), no-op runtime", "noop", doorStream, 0},
		{"agora end to end (agora.api.dispatch request/reply → dispatcher → worker), no-op runtime", "noop", doorMicro, 0},
		{"agora worker path (dispatch message → worker), exec /bin/true through the sandbox launcher", "exec", doorWork, 1},
		{"agora end to end (request → dispatcher → worker), exec /bin/true", "exec", doorStream, 1},
	} {
		if rt.runtime == "exec" && cfg.NoExec {
			continue
		}
		peak := mem.window()
		sc, stop, err := workerPath(ctx, url, js, wsRoot, cfg.Concurrency, rt.runtime, rt.door)
		if err != nil {
			return Report{}, err
		}
		sc.name = rt.name
		say("measuring %s", sc.name)
		row, err := measure(ctx, sc, cfg)
		stop()
		if err != nil {
			return Report{}, err
		}
		row.baseline, row.PeakRSSMiB = rt.baseline, peak()
		rep.Rows = append(rep.Rows, row)
	}
	say("measuring the end-to-end no-op path with tracing on")
	peak := mem.window()
	trow, spans, stages, err := traced(ctx, url, js, wsRoot, cfg)
	if err != nil {
		return Report{}, err
	}
	trow.PeakRSSMiB = peak()
	rep.Rows, rep.TracedSpans, rep.Stages, rep.breakdown = append(rep.Rows, trow), spans, stages, cfg.Breakdown
	say("measuring artifact upload")
	arts, err := artifactUpload(ctx, url, js, wsRoot, cfg, &mem)
	if err != nil {
		return Report{}, err
	}
	rep.Artifacts = arts
	say("measuring resume latency")
	samples := cfg.Serial / 4
	if samples < 20 {
		samples = 20
	}
	peak = mem.window()
	row, err := resume(ctx, url, js, wsRoot, samples, nil, false)
	if err != nil {
		return Report{}, err
	}
	row.PeakRSSMiB = peak()
	rep.Rows = append(rep.Rows, row)
	// The same path with the decision log's writer running, compared
	// with the row above (docs/audit.md, "Cost").
	say("measuring resume latency with the decision log written")
	peak = mem.window()
	arow, err := resume(ctx, url, js, wsRoot, samples, nil, true)
	if err != nil {
		return Report{}, err
	}
	arow.PeakRSSMiB, arow.baseline = peak(), len(rep.Rows)-1
	rep.Rows = append(rep.Rows, arow)
	peak = mem.window()
	pair, stopStatus, err := statusRead(ctx, url, js)
	if err != nil {
		return Report{}, err
	}
	base := len(rep.Rows)
	for i, sc := range pair {
		say("measuring %s", sc.name)
		row, err := measure(ctx, sc, cfg)
		if err != nil {
			stopStatus()
			return Report{}, err
		}
		row.baseline, row.PeakRSSMiB = base, peak()
		if i == 3 {
			row.baseline = base + 2 // the owner check, against the same door as an admin
		}
		rep.Rows = append(rep.Rows, row)
	}
	stopStatus()
	if cfg.NoExec {
		say("leaving out the sandbox's layers (--no-exec)")
	} else {
		say("measuring the sandbox's layers, one at a time")
		if rep.Layers, err = sandboxLayers(ctx, wsRoot, samples); err != nil {
			return Report{}, err
		}
	}
	if cfg.Breakdown {
		say("measuring resume latency with tracing on, for its stages")
		peak = mem.window()
		if rep.ResumeStages, err = tracedResume(ctx, url, js, wsRoot, samples); err != nil {
			return Report{}, err
		}
		peak()
	}
	for i := range rep.Rows {
		r := &rep.Rows[i]
		if i == r.baseline {
			continue // a baseline row
		}
		b := rep.Rows[r.baseline]
		r.Baseline = b.Scenario
		if b.P50MS > 0 {
			r.P50Ratio = r.P50MS / b.P50MS
		}
		if b.PerSecond > 0 && r.PerSecond > 0 {
			r.RateRatio = r.PerSecond / b.PerSecond
		}
	}
	rep.PeakRSSMiB = mem.all()
	return rep, nil
}

// measure runs serial round trips for latency, then Throughput round trips
// with Concurrency in flight for the rate.
func measure(ctx context.Context, sc scenario, cfg Config) (Row, error) {
	// Warm up connections, consumers and caches.
	for range 20 {
		if err := sc.do(ctx, lifecycle.NewID()); err != nil {
			return Row{}, fmt.Errorf("%s: warm-up: %w", sc.name, err)
		}
	}
	lat := make([]time.Duration, 0, cfg.Serial)
	if sc.phase != nil {
		sc.phase(phaseSerial)
	}
	for range cfg.Serial {
		t0 := time.Now()
		if err := sc.do(ctx, lifecycle.NewID()); err != nil {
			return Row{}, fmt.Errorf("%s: %w", sc.name, err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return percentileMS(lat, p) }
	ids := make(chan string)
	errs := make(chan error, cfg.Concurrency)
	var wg sync.WaitGroup
	if sc.phase != nil {
		sc.phase(phaseThroughput)
	}
	t0, cpu0 := time.Now(), cpuTime()
	// A handler that fails keeps taking ids without running them, so the
	// feed below never waits on handlers that all stopped; each sends at
	// most one error.
	for range cfg.Concurrency {
		wg.Go(func() {
			failed := false
			for id := range ids {
				if failed {
					continue
				}
				if err := sc.do(ctx, id); err != nil {
					errs <- err
					failed = true
				}
			}
		})
	}
	for range cfg.Throughput {
		ids <- lifecycle.NewID()
	}
	close(ids)
	wg.Wait()
	el, cpu := time.Since(t0), cpuTime()-cpu0
	select {
	case err := <-errs:
		return Row{}, fmt.Errorf("%s: %w", sc.name, err)
	default:
	}
	return Row{Scenario: sc.name, P50MS: pct(0.50), P99MS: pct(0.99), PerSecond: float64(cfg.Throughput) / el.Seconds(),
		Serial: cfg.Serial, Throughput: cfg.Throughput, CPUMS: float64(cpu.Microseconds()) / 1000 / float64(cfg.Throughput)}, nil
}

// waiter routes observed ends to the callers waiting for them.
type waiter struct {
	mu sync.Mutex
	w  map[string]chan struct{}
}

func newWaiter() *waiter { return &waiter{w: map[string]chan struct{}{}} }

func (w *waiter) expect(id string) chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	w.w[id] = ch
	w.mu.Unlock()
	return ch
}

func (w *waiter) done(id string) {
	w.mu.Lock()
	ch, ok := w.w[id]
	delete(w.w, id)
	w.mu.Unlock()
	if ok {
		close(ch)
	}
}

func wait(ctx context.Context, ch chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("no end observed within 30s")
	}
}

// baseline is the same shape of work on raw JetStream: request → pull
// consumer → two event publishes → observer.
func baseline(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, conc int, withExec bool) (scenario, func(), error) {
	for _, sc := range []jetstream.StreamConfig{
		{Name: "BENCH_REQ", Subjects: []string{"bench.req.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage},
		{Name: "BENCH_EVT", Subjects: []string{"bench.evt.>"}, Storage: jetstream.FileStorage},
	} {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return scenario{}, nil, err
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "BENCH_REQ", jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 10000})
	if err != nil {
		return scenario{}, nil, err
	}
	w := newWaiter()
	sub, err := nc.Subscribe("bench.evt.finished.*", func(m *nats.Msg) { w.done(m.Header.Get("id")) })
	if err != nil {
		return scenario{}, nil, err
	}
	hctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for hctx.Err() == nil {
				m, err := cons.Next(jetstream.FetchMaxWait(500 * time.Millisecond))
				if err != nil {
					continue
				}
				id := m.Headers().Get("id")
				for i, k := range []string{"started", "finished"} {
					if i == 1 && withExec {
						_ = exec.Command("/bin/true").Run()
					}
					out := nats.NewMsg("bench.evt." + k + "." + id)
					out.Header.Set("id", id)
					out.Header.Set(jetstream.MsgIDHeader, id+"."+k)
					out.Data = []byte(`{"dispatch_id":"` + id + `"}`)
					_, _ = js.PublishMsg(hctx, out)
				}
				_ = m.DoubleAck(hctx)
			}
		})
	}
	stop := func() { cancel(); wg.Wait(); _ = sub.Unsubscribe() }
	name := "baseline: raw JetStream request → consumer → started+finished → observer"
	if withExec {
		name = "baseline: raw JetStream + fork/exec /bin/true between started and finished"
	}
	return scenario{name: name, do: func(ctx context.Context, id string) error {
		ch := w.expect(id)
		m := nats.NewMsg("bench.req." + id)
		m.Header.Set("id", id)
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Data = []byte(`{"subagent":"bench","input":{}}`)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return err
		}
		return wait(ctx, ch)
	}}, stop, nil
}

// artifactRuntime leaves one artifact of fixed bytes and exits.
type artifactRuntime struct{ data []byte }

func (a artifactRuntime) Run(_ context.Context, inv worker.Invocation) worker.Result {
	if err := os.WriteFile(filepath.Join(inv.Workspace, lifecycle.ArtifactsDir, "blob.bin"), a.data, 0o600); err != nil {
		return worker.Result{ExitCode: 1, Err: err}
	}
	return worker.Result{}
}

// artifactUpload measures upload throughput: serial puts of one object to
// a scratch object store, then serial dispatches through the worker whose
// run leaves one artifact of the same size (the whole worker path, the
// upload dominating).
func artifactUpload(ctx context.Context, url string, js jetstream.JetStream, dir string, cfg Config, mem *peaks) ([]ArtifactRow, error) {
	const size = 8 << 20
	peak := mem.window()
	n := max(cfg.Serial/50, 5)
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		return nil, err
	}
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "bench_raw", Storage: jetstream.FileStorage})
	if err != nil {
		return nil, err
	}
	defer js.DeleteObjectStore(context.WithoutCancel(ctx), "bench_raw")
	t0 := time.Now()
	for i := range n {
		if _, err := obs.PutBytes(ctx, fmt.Sprintf("blob-%d", i), data); err != nil {
			return nil, err
		}
	}
	raw := ArtifactRow{Scenario: "raw object-store put", SizeMiB: size >> 20, Samples: n,
		MiBPerSecond: float64(n*size>>20) / time.Since(t0).Seconds()}
	raw.PeakRSSMiB = peak()

	peak = mem.window()
	sc, stop, err := workerPathWith(ctx, url, js, dir, 2, "artifact", map[string]worker.InProcess{subagent.RuntimeExec: artifactRuntime{data}}, doorWork)
	if err != nil {
		return nil, err
	}
	defer stop()
	if err := sc.do(ctx, lifecycle.NewID()); err != nil { // warm up
		return nil, err
	}
	t0 = time.Now()
	for range n {
		if err := sc.do(ctx, lifecycle.NewID()); err != nil {
			return nil, err
		}
	}
	agora := ArtifactRow{Scenario: "agora worker path with one artifact per dispatch", SizeMiB: size >> 20, Samples: n,
		MiBPerSecond: float64(n*size>>20) / time.Since(t0).Seconds(), PeakRSSMiB: peak()}
	if raw.MiBPerSecond > 0 {
		agora.Ratio = agora.MiBPerSecond / raw.MiBPerSecond
	}
	return []ArtifactRow{raw, agora}, nil
}

type noopRuntime struct{}

func (noopRuntime) Run(context.Context, worker.Invocation) worker.Result { return worker.Result{} }

// workerPath runs a real worker (own connection) and measures a dispatch
// entering at door in (a work message on agora.dispatch.*, or through a
// dispatcher of its own at either of its doors) → worker → `finished`
// observed.
func workerPath(ctx context.Context, url string, js jetstream.JetStream, dir string, conc int, runtime string, in door) (scenario, func(), error) {
	var runtimes map[string]worker.InProcess
	if runtime == "noop" {
		runtimes = map[string]worker.InProcess{subagent.RuntimeExec: noopRuntime{}}
	}
	return workerPathWith(ctx, url, js, dir, conc, runtime, runtimes, in)
}

// workerPathWith is workerPath with the worker's runtimes given.
func workerPathWith(ctx context.Context, url string, js jetstream.JetStream, dir string, conc int, runtime string, runtimes map[string]worker.InProcess, in door) (scenario, func(), error) {
	viaDispatcher := in != doorWork
	def := subagent.Definition{Name: "bench", Runtime: subagent.RuntimeExec, Command: []string{"/bin/true"}}
	rev, err := applyDef(ctx, js, def)
	if err != nil {
		return scenario{}, nil, err
	}
	o := stack.Options{URL: url, InProcess: runtimes, ReadyTimeout: 30 * time.Second,
		Workers: []worker.Config{{Concurrency: conc, WorkspaceRoot: dir + "/ws-" + runtime, ID: "bench-" + runtime, PullExpiry: 500 * time.Millisecond}}}
	if viaDispatcher {
		o.Dispatcher = &dispatcher.Config{ID: "bench", Concurrency: 4 * conc, ReconcileLookback: reconcileLookback}
	}
	st, err := stack.Start(ctx, o)
	if err != nil {
		return scenario{}, nil, err
	}
	// The worker-path rows publish events of dispatches the dispatcher
	// never saw; its projection reads them all when it first starts.
	// Measured during that catch-up, the first end-to-end row came out
	// slower than later ones.
	if viaDispatcher {
		if err := projectionCaughtUp(ctx, js, 60*time.Second); err != nil {
			_ = st.Close()
			return scenario{}, nil, err
		}
	}
	onc, err := nats.Connect(url)
	if err != nil {
		_ = st.Close()
		return scenario{}, nil, err
	}
	stop := func() { _ = st.Close(); onc.Close() }
	wt := newWaiter()
	_, err = onc.Subscribe(lifecycle.SubjectLifecycleAll, func(m *nats.Msg) {
		// Only a finished ends a round trip: a failed or cancelled
		// one is lost (Run's watch stops the run).
		a, err := lifecycle.ParseLifecycleSubject(m.Subject)
		if err == nil && a.Kind == lifecycle.KindFinished {
			wt.done(a.DispatchID)
		}
	})
	if err != nil {
		stop()
		return scenario{}, nil, err
	}
	if in == doorMicro {
		cl, err := client.New(onc)
		if err != nil {
			stop()
			return scenario{}, nil, err
		}
		return scenario{do: func(ctx context.Context, id string) error {
			ch := wt.expect(id)
			// A client's dispatch: it returns once the dispatcher
			// answered that it accepted and queued the request.
			if _, err := cl.Dispatch(ctx, lifecycle.Request{DispatchID: id, Subagent: def.Name, Input: json.RawMessage(`{}`)}); err != nil {
				return err
			}
			return wait(ctx, ch)
		}}, stop, nil
	}
	src := lifecycle.Source("bench", "client")
	subj, _ := lifecycle.DispatchSubject(def.Name)
	if viaDispatcher {
		subj, _ = lifecycle.RequestSubject(def.Name)
	}
	return scenario{do: func(ctx context.Context, id string) error {
		ch := wt.expect(id)
		req := &lifecycle.Request{DispatchID: id, ThreadID: id, Subagent: def.Name, Input: json.RawMessage(`{}`), SubagentRevision: rev}
		if viaDispatcher {
			// A client's request: the dispatcher fills thread and revision.
			req = &lifecycle.Request{DispatchID: id, Subagent: def.Name, Input: json.RawMessage(`{}`)}
		}
		e, err := lifecycle.New(src, req)
		if err != nil {
			return err
		}
		m, err := lifecycle.Encode(subj, e)
		if err != nil {
			return err
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return err
		}
		return wait(ctx, ch)
	}}, stop, nil
}

// door is where a bench row's dispatches enter.
type door int

const (
	doorWork   door = iota // a work message straight on agora.dispatch.*, no dispatcher
	doorStream             // a request on agora.requests.* (the stream door)
	doorMicro              // client.Dispatch: agora.api.dispatch request/reply (the micro door)
)

// reconcileLookback is the benches' dispatchers' first reconcile pass:
// not the default week, which would have each scenario's dispatcher read
// every record the earlier scenarios wrote (tens of thousands) while it is
// being measured. Nothing is left unqueued in a bench.
const reconcileLookback = time.Minute

// projectionCaughtUp waits until the dispatcher's projection consumer has
// nothing pending or unacknowledged.
func projectionCaughtUp(ctx context.Context, js jetstream.JetStream, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := js.Consumer(ctx, lifecycle.StreamLifecycle, provision.ConsumerProjection)
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the dispatcher's projection did not catch up within %s (%d pending)", within, info.NumPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Print writes the report as tables that fit 100 columns: the rows
// numbered, their scenarios (and baselines) in a legend below.
func Print(w io.Writer, r Report) { print(w, r, false) }

// PrintWide writes the report with each row's scenario in its line.
func PrintWide(w io.Writer, r Report) { print(w, r, true) }

func print(w io.Writer, r Report, wide bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "scenario\tp50 ms\tp99 ms\tper second\tp50 × baseline\trate × baseline\tCPU ms each\tpeak RSS MiB")
	} else {
		fmt.Fprintln(tw, "#\tp50 ms\tp99 ms\tper s\tp50 ×\trate ×\tCPU ms\tRSS MiB\tbaseline")
	}
	for i, row := range r.Rows {
		p, q := "1.00", "1.00"
		if row.Baseline != "" {
			p, q = fmt.Sprintf("%.2f", row.P50Ratio), fmt.Sprintf("%.2f", row.RateRatio)
		}
		rate := fmt.Sprintf("%.0f", row.PerSecond)
		if row.PerSecond == 0 {
			rate, q = "-", "-"
		}
		cpu := fmt.Sprintf("%.3f", row.CPUMS)
		if row.PerSecond == 0 {
			cpu = "-"
		}
		if wide {
			fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t%.1f\n", row.Scenario, row.P50MS, row.P99MS, rate, p, q, cpu, row.PeakRSSMiB)
			continue
		}
		base := "-"
		if row.Baseline != "" {
			base = "#" + strconv.Itoa(row.baseline+1)
		}
		fmt.Fprintf(tw, "%d\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t%.1f\t%s\n", i+1, row.P50MS, row.P99MS, rate, p, q, cpu, row.PeakRSSMiB, base)
	}
	tw.Flush()
	if !wide {
		for i, row := range r.Rows {
			fmt.Fprintf(w, "%s\n", wrap(fmt.Sprintf("%2d  ", i+1), row.Scenario, 100))
		}
	}
	if len(r.Artifacts) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "artifact upload\tMiB/s\t× raw put\tpeak RSS MiB")
		for _, a := range r.Artifacts {
			ratio := "1.00"
			if a.Ratio > 0 {
				ratio = fmt.Sprintf("%.2f", a.Ratio)
			}
			fmt.Fprintf(tw, "%s\t%.1f\t%s\t%.1f\n", a.Scenario, a.MiBPerSecond, ratio, a.PeakRSSMiB)
		}
		tw.Flush()
	}
	printLayers(w, r.Layers, wide)
	if r.breakdown && len(r.Stages) > 0 {
		printStages(w, fmt.Sprintf("stages of the traced row, its serial round trips (%d spans exported in all; docs/tracing.md names them)", r.TracedSpans), r.Stages)
	}
	if r.breakdown && len(r.ResumeStages) > 0 {
		printStages(w, "stages of a resume, traced: each answer and everything it caused (the router's answer and re-dispatch, the next round's acceptance and run)", r.ResumeStages)
	}
	if r.breakdown && len(r.Stages)+len(r.ResumeStages) > 0 {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "ratios: no-op rows against the first baseline, exec rows against the fork/exec baseline\n")
	fmt.Fprintf(w, "concurrency %d; sandbox %s; peak RSS %.1f MiB\nlauncher %s\nworkspaces under %s\n", r.Concurrency, r.SandboxMode, r.PeakRSSMiB, r.Launcher, r.WorkspaceRoot)
}

// printStages prints a breakdown table under its title.
func printStages(w io.Writer, title string, stages []Stage) {
	fmt.Fprintf(w, "\n%s\n", title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "span\tcount\tp50 ms\tp99 ms")
	for _, st := range stages {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\n", st.Span, st.Count, st.P50MS, st.P99MS)
	}
	_ = tw.Flush()
}

// wrap writes text after prefix in lines of at most width columns, the
// lines after the first indented as far as the prefix.
func wrap(prefix, text string, width int) string {
	var b strings.Builder
	line, indent := prefix, strings.Repeat(" ", len(prefix))
	for _, word := range strings.Fields(text) {
		if len(line)+len(word) > width && strings.TrimSpace(line) != strings.TrimSpace(prefix) {
			b.WriteString(strings.TrimRight(line, " ") + "\n")
			line = indent
		}
		line += word + " "
	}
	b.WriteString(strings.TrimRight(line, " "))
	return b.String()
}
