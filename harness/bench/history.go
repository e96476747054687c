package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// HistoryConfig sizes `agora bench --scale history`: Threads threads go
// through ask → answer → finish, then the run waits for the retention to
// pass (docs/storage.md, "Retention").
type HistoryConfig struct {
	Threads   int           // default 20000
	Retention time.Duration // default 30s
	InFlight  int           // threads at once; default 64
	Slots     int           // worker slots; default 16
	// Settle, when set, waits this much longer after the retention and
	// takes one more point ("settled"): JetStream keeps the streams'
	// duplicate windows (10 minutes by default) whatever the retention.
	Settle time.Duration
	// Deadline bounds the whole scenario; default 3 minutes and 50 ms a
	// thread beyond the retention and Settle. A dispatch that ends failed
	// or cancelled stops it sooner.
	Deadline time.Duration
	// HeapProfiles, when set, is a directory where a heap profile is
	// written at each point, after a collection (<point>.pb.gz): `go tool
	// pprof -base start.pb.gz settled.pb.gz` shows what stays. The run
	// then samples one allocation in heapProfileRate bytes, not one in
	// 512 KiB, so holders of a few hundred KiB show.
	HeapProfiles string
}

// HistoryPoint is what the process holds at one point of the run.
type HistoryPoint struct {
	Point string `json:"point"` // start, peak, after_retention, settled
	// LiveMiB is the live heap (HeapAlloc after a collection); HeapMiB
	// the heap's spans in use (HeapInuse), which also counts the free
	// room inside spans that hold live objects.
	LiveMiB      float64 `json:"heap_live_mib"`
	HeapMiB      float64 `json:"heap_inuse_mib"`
	RSSMiB       float64 `json:"rss_mib"`
	DispatchKeys uint64  `json:"dispatch_keys"` // keys of agora_dispatches (records and thread indexes)
	QuestionKeys uint64  `json:"question_keys"` // keys of agora_questions
	Goroutines   int     `json:"goroutines"`
	// Messages is what every stream holds, the buckets' and object
	// stores' streams (KV_…, OBJ_…) included: values, markers and events.
	Messages map[string]uint64 `json:"stream_messages"`
}

// HistoryReport is the scenario's result.
type HistoryReport struct {
	Threads          int            `json:"threads"`
	Retention        string         `json:"retention"`
	Seconds          float64        `json:"seconds"`
	ThreadsPerSecond float64        `json:"threads_per_second"`
	Points           []HistoryPoint `json:"points"`
	// IdleCPUPercent is the process's CPU over 10 s with nothing to do,
	// after the retention passed (percent of one core).
	IdleCPUPercent float64 `json:"idle_cpu_percent"`
	PeakRSSMiB     float64 `json:"peak_rss_mib"`
	// Storage is what every stream held after the first StorageThreads
	// threads ended, none in flight and none expired yet: the capacity
	// figures per thread.
	Storage        []StreamBytes `json:"storage"`
	StorageThreads int           `json:"storage_threads"`
}

// StreamBytes is one stream's size at the peak.
type StreamBytes struct {
	Stream    string  `json:"stream"`
	Messages  uint64  `json:"messages"`
	Bytes     uint64  `json:"bytes"`
	PerThread float64 `json:"bytes_per_thread"`
}

// History runs the history scenario: the whole of Agora in this process
// (dispatcher, worker, router, inbox and an answerer) on an embedded
// file-store server. It returns an error naming every dispatch that ended
// failed or cancelled.
func History(ctx context.Context, cfg HistoryConfig, progress io.Writer) (HistoryReport, error) {
	if cfg.Threads <= 0 {
		cfg.Threads = 20000
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * time.Second
	}
	if cfg.InFlight <= 0 {
		cfg.InFlight = 64
	}
	if cfg.Slots <= 0 {
		cfg.Slots = 16
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = 3*time.Minute + time.Duration(cfg.Threads)*50*time.Millisecond + cfg.Retention + cfg.Settle
	}
	return bounded(ctx, "--scale history", cfg.Deadline, func(ctx context.Context, l *lost) (HistoryReport, error) {
		return history(ctx, cfg, l, progress)
	})
}

func history(ctx context.Context, cfg HistoryConfig, l *lost, progress io.Writer) (HistoryReport, error) {
	say := sayer(progress)
	if cfg.HeapProfiles != "" {
		if err := os.MkdirAll(cfg.HeapProfiles, 0o755); err != nil {
			return HistoryReport{}, fmt.Errorf("bench: heap profiles: %w", err)
		}
		runtime.MemProfileRate = heapProfileRate
	}
	st, err := startStack(ctx, stackConfig{Slots: cfg.Slots, Retention: cfg.Retention,
		Extra: []func(context.Context, *client.Client, *slog.Logger) error{func(ctx context.Context, c *client.Client, log *slog.Logger) error {
			return answerer.ServeClient(ctx, c, "human", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
				return answerer.Answer("A"), nil
			}), answerer.WithConcurrency(cfg.Slots), answerer.WithLogger(log))
		}}})
	if err != nil {
		return HistoryReport{}, err
	}
	defer st.close()
	js, nc, c := st.JetStream(), st.nc, st.Client()
	unwatch, err := l.watch(nc)
	if err != nil {
		return HistoryReport{}, err
	}
	defer unwatch()

	point := func(name string) (HistoryPoint, error) {
		p := HistoryPoint{Point: name}
		p.LiveMiB, p.HeapMiB, p.RSSMiB, p.Goroutines = heapMemory()
		if cfg.HeapProfiles != "" {
			if err := writeHeapProfile(filepath.Join(cfg.HeapProfiles, name+".pb.gz")); err != nil {
				return p, err
			}
		}
		var err error
		if p.DispatchKeys, err = st.bucketKeys(ctx, lifecycle.BucketDispatches); err != nil {
			return p, err
		}
		if p.QuestionKeys, err = st.bucketKeys(ctx, lifecycle.BucketQuestions); err != nil {
			return p, err
		}
		p.Messages, err = streamMessages(ctx, js)
		return p, err
	}
	rep := HistoryReport{Threads: cfg.Threads, Retention: cfg.Retention.String()}
	p, err := point("start")
	if err != nil {
		return rep, err
	}
	rep.Points = append(rep.Points, p)

	// Threads end with a finished event of their round 1: count them on a
	// plain subscription, freeing a slot for the next thread.
	slots := make(chan struct{}, cfg.InFlight)
	var done atomic.Int64
	sub, err := nc.Subscribe(lifecycle.LifecycleFilter(lifecycle.KindFinished, "", ""), func(*nats.Msg) {
		done.Add(1)
		<-slots
	})
	if err != nil {
		return rep, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	// storage reads what every stream holds after n threads ended and
	// none is in flight.
	storage := func(n int) ([]StreamBytes, error) {
		states, err := streamStates(ctx, js)
		if err != nil {
			return nil, err
		}
		var out []StreamBytes
		for name, st := range states {
			out = append(out, StreamBytes{Stream: name, Messages: st.Msgs, Bytes: st.Bytes, PerThread: float64(st.Bytes) / float64(n)})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
		return out, nil
	}
	// The capacity sample: after the first sampleAt threads, with none in
	// flight, before any has expired.
	sampleAt := min(cfg.Threads, 1000)
	t0 := time.Now()
	sample := func(n int) error {
		for done.Load() < int64(n) {
			select {
			case <-ctx.Done():
				return stopped(ctx, "%d of the first %d threads finished", done.Load(), n)
			case <-time.After(10 * time.Millisecond):
			}
		}
		time.Sleep(500 * time.Millisecond) // the projection ends the last threads
		if time.Since(t0) >= cfg.Retention {
			say("  the first %d threads took longer than the retention: no capacity sample", n)
			return nil
		}
		var err error
		rep.Storage, err = storage(n)
		rep.StorageThreads = n
		return err
	}
	say("pushing %d threads through ask → answer → finish (%d at once, retention %s)", cfg.Threads, cfg.InFlight, cfg.Retention)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for i := range cfg.Threads {
		if i == sampleAt {
			if err := sample(i); err != nil {
				return rep, err
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return rep, stopped(ctx, "%d of %d threads dispatched, %d finished", i, cfg.Threads, done.Load())
		}
		if _, err := c.Dispatch(ctx, lifecycle.Request{Subagent: askingSubagent}); err != nil {
			return rep, fmt.Errorf("dispatch %d: %w", i, err)
		}
		select {
		case <-tick.C:
			say("  %d / %d threads finished (%.0f/s)", done.Load(), cfg.Threads, float64(done.Load())/time.Since(t0).Seconds())
		default:
		}
	}
	for done.Load() < int64(cfg.Threads) {
		select {
		case <-ctx.Done():
			return rep, stopped(ctx, "%d of %d threads finished", done.Load(), cfg.Threads)
		case <-tick.C:
			say("  %d / %d threads finished", done.Load(), cfg.Threads)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if sampleAt == cfg.Threads {
		if err := sample(sampleAt); err != nil {
			return rep, err
		}
	}
	rep.Seconds = time.Since(t0).Seconds()
	rep.ThreadsPerSecond = float64(cfg.Threads) / rep.Seconds
	time.Sleep(time.Second) // the projection ends the last threads
	if p, err = point("peak"); err != nil {
		return rep, err
	}
	rep.Points = append(rep.Points, p)
	wait := cfg.Retention + 5*time.Second
	say("all %d threads finished in %.0fs; waiting %s for the retention to pass", cfg.Threads, rep.Seconds, wait)
	select {
	case <-time.After(wait):
	case <-ctx.Done():
		return rep, ctx.Err()
	}
	if p, err = point("after_retention"); err != nil {
		return rep, err
	}
	rep.Points = append(rep.Points, p)
	if cfg.Settle > 0 {
		say("waiting %s more (the duplicate windows)", cfg.Settle)
		select {
		case <-time.After(cfg.Settle):
		case <-ctx.Done():
			return rep, ctx.Err()
		}
		if p, err = point("settled"); err != nil {
			return rep, err
		}
		rep.Points = append(rep.Points, p)
	}
	say("measuring idle CPU for 10s")
	rep.IdleCPUPercent = idleCPU(10 * time.Second)
	rep.PeakRSSMiB = procKiB("VmHWM") / 1024
	return rep, nil
}

// streamMessages reads how many messages every stream holds, by name.
func streamMessages(ctx context.Context, js jetstream.JetStream) (map[string]uint64, error) {
	states, err := streamStates(ctx, js)
	out := map[string]uint64{}
	for name, st := range states {
		out[name] = st.Msgs
	}
	return out, err
}

// streamStates reads the state of every stream, by name.
func streamStates(ctx context.Context, js jetstream.JetStream) (map[string]jetstream.StreamState, error) {
	out := map[string]jetstream.StreamState{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		out[name] = info.State
	}
	return out, names.Err()
}

// heapMemory is memory with the live heap (HeapAlloc after the
// collection) first.
func heapMemory() (liveMiB, inuseMiB, rssMiB float64, goroutines int) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return mib(ms.HeapAlloc), mib(ms.HeapInuse), procKiB("VmRSS") / 1024, runtime.NumGoroutine()
}

// heapProfileRate is the heap profile's sampling rate (bytes per sample)
// with HistoryConfig.HeapProfiles.
const heapProfileRate = 8 << 10

// writeHeapProfile writes a heap profile to path after a collection, so
// its in-use figures are the live heap of now.
func writeHeapProfile(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: heap profile: %w", err)
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("bench: heap profile: %w", err)
	}
	return f.Close()
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// procKiB reads a kB field of /proc/self/status (VmRSS, VmHWM); 0 when it
// cannot.
func procKiB(field string) float64 { return statusKiB("/proc/self/status", field) }

// statusKiB reads a kB field of a /proc file of "Name: N kB" lines
// (status, smaps_rollup); 0 when it cannot.
func statusKiB(path, field string) float64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return n
		}
	}
	return 0
}

// procCPU is the process's user + system CPU time so far.
func procCPU() time.Duration { return rusageCPU(syscall.RUSAGE_SELF) }

// cpuTime is procCPU with the CPU of this process's children: those it
// has waited for (launchers the worker forked) and those still running
// with what they have waited for (the sandbox's spawner and the launchers
// it forked, docs/sandbox.md "The spawner"). A child waited for between
// the two reads counts twice or not at all: one launcher's CPU, against a
// row's thousand.
func cpuTime() time.Duration {
	return procCPU() + rusageCPU(syscall.RUSAGE_CHILDREN) + liveChildrenCPU()
}

// liveChildrenCPU sums, over the children of this process that still run,
// their CPU and that of the children they have waited for.
func liveChildrenCPU() time.Duration {
	tasks, _ := os.ReadDir("/proc/self/task")
	var sum time.Duration
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			if _, cpu, waited, ok := procStat(pid); ok {
				sum += cpu + waited
			}
		}
	}
	return sum
}

func rusageCPU(who int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// PrintHistory writes the history report as a table.
func PrintHistory(w io.Writer, rep HistoryReport) {
	fmt.Fprintf(w, "%d threads (ask → answer → finish) in %.0f s (%.0f threads/s), retention %s\n\n", rep.Threads, rep.Seconds, rep.ThreadsPerSecond, rep.Retention)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "point\tlive heap MiB\tHeapInuse MiB\tRSS MiB\tagora_dispatches keys\tagora_questions keys\tgoroutines\t")
	for _, p := range rep.Points {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%d\t%d\t%d\t\n", p.Point, p.LiveMiB, p.HeapMiB, p.RSSMiB, p.DispatchKeys, p.QuestionKeys, p.Goroutines)
	}
	_ = tw.Flush()
	printMessages(w, rep.Points)
	fmt.Fprintf(w, "\npeak RSS %.1f MiB; idle CPU after the retention %.2f%% of one core\n", rep.PeakRSSMiB, rep.IdleCPUPercent)
	if len(rep.Storage) > 0 {
		fmt.Fprintf(w, "\nstorage after the first %d threads (two rounds each; none in flight, none expired):\n", rep.StorageThreads)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "stream\tmessages\tMiB\tbytes per thread\t")
		var total float64
		for _, s := range rep.Storage {
			fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.0f\t\n", s.Stream, s.Messages, mib(s.Bytes), s.PerThread)
			total += s.PerThread
		}
		fmt.Fprintf(tw, "total\t\t\t%.0f\t\n", total)
		_ = tw.Flush()
	}
}

// printMessages writes every stream's message count at each point, one
// row per stream.
func printMessages(w io.Writer, points []HistoryPoint) {
	names := map[string]bool{}
	for _, p := range points {
		for n := range p.Messages {
			names[n] = true
		}
	}
	if len(names) == 0 {
		return
	}
	fmt.Fprintf(w, "\nmessages held (values, markers, events):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "stream\t")
	for _, p := range points {
		fmt.Fprintf(tw, "%s\t", p.Point)
	}
	fmt.Fprintln(tw)
	for _, n := range slices.Sorted(maps.Keys(names)) {
		fmt.Fprintf(tw, "%s\t", n)
		for _, p := range points {
			fmt.Fprintf(tw, "%d\t", p.Messages[n])
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}
