package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// LongConfig sizes `agora bench --scale long`: Running dispatches run at
// once, each a sleeping sub-agent holding its slot, spread over Workers
// worker processes; the scenario measures what a running dispatch costs
// while nothing else happens.
type LongConfig struct {
	Running int           // default 1000
	Workers int           // default 4
	Window  time.Duration // how long the heartbeats are counted; default 30s
	// Exe is the agora binary: each worker is its own process, `agora
	// service worker`, with the sandbox launcher it finds beside it.
	Exe string
	// Deadline bounds the whole scenario; default 5 minutes and 50 ms a
	// run beyond the window. A dispatch that ends failed or cancelled
	// before the workers are killed stops it sooner.
	Deadline time.Duration
}

// LongReport is the scenario's result.
type LongReport struct {
	Running      int     `json:"running"`
	Workers      int     `json:"workers"`       // worker processes
	StartSeconds float64 `json:"start_seconds"` // dispatch → every run started
	// The worker processes together, idle and with every dispatch
	// running, and the difference per running dispatch.
	WorkerStartRSSMiB  float64 `json:"worker_start_rss_mib"`
	WorkerRSSMiB       float64 `json:"worker_rss_mib"`
	WorkerRSSKiBPerRun float64 `json:"worker_rss_kib_per_running_dispatch"`
	// What the runs hold outside the workers: each run's launcher and its
	// sub-agent, as processes, their RSS (shared pages counted in each)
	// and PSS (shared pages split) per running dispatch.
	RunProcesses    int     `json:"run_processes"`
	RunRSSKiBPerRun float64 `json:"run_rss_kib_per_running_dispatch"`
	RunPSSKiBPerRun float64 `json:"run_pss_kib_per_running_dispatch"`
	// This process (the server, dispatcher, router and inbox), idle and
	// with every dispatch running.
	StartHeapMiB      float64 `json:"start_heap_inuse_mib"`
	StartRSSMiB       float64 `json:"start_rss_mib"`
	HeapMiB           float64 `json:"heap_inuse_mib"`
	RSSMiB            float64 `json:"rss_mib"`
	HeartbeatsPerSec  float64 `json:"heartbeats_per_second"`
	HeartbeatPeriod   string  `json:"heartbeat_period"`
	ServerMsgsInPerS  float64 `json:"server_msgs_in_per_second"`
	ServerMsgsOutPerS float64 `json:"server_msgs_out_per_second"`
	// CPU over the window, in percent of one core: this process, the
	// workers, and the runs' own processes.
	CPUPercent       float64 `json:"cpu_percent"`
	WorkerCPUPercent float64 `json:"worker_cpu_percent"`
	RunCPUPercent    float64 `json:"run_cpu_percent"`
	PeakRSSMiB       float64 `json:"peak_rss_mib"` // this process
	// LeftBehind counts the runs' sub-agent processes still alive after
	// the workers were killed (each run's namespace dies with its
	// launcher, which dies with its worker): always 0 unless something
	// escaped.
	LeftBehind int `json:"processes_left_behind"`
	// MountsLeft counts the workspace filesystems the killed workers left
	// mounted; MountsAfterSweep those still mounted once each workspace
	// root was swept as a worker starting on it would
	// (worker.SweepWorkspaces): always 0 unless the sweep misses some.
	MountsLeft       int `json:"workspace_mounts_left"`
	MountsAfterSweep int `json:"workspace_mounts_after_sweep"`
}

// holdSubagent is the long runs' sub-agent: it sleeps an hour. Its
// argument carries a mark of this run, so its processes can be found.
const holdSubagent = "bench-hold"

// Long runs the long-runs scenario: Agora's other services in this
// process, the workers as processes of their own.
func Long(ctx context.Context, cfg LongConfig, progress io.Writer) (LongReport, error) {
	if cfg.Running <= 0 {
		cfg.Running = 1000
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Window <= 0 {
		cfg.Window = 30 * time.Second
	}
	if cfg.Exe == "" {
		return LongReport{}, errors.New("bench: the long runs need the agora binary to start worker processes")
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = 5*time.Minute + time.Duration(cfg.Running)*50*time.Millisecond + cfg.Window
	}
	return bounded(ctx, "--scale long", cfg.Deadline, func(ctx context.Context, l *lost) (LongReport, error) {
		return long(ctx, cfg, l, progress)
	})
}

func long(ctx context.Context, cfg LongConfig, l *lost, progress io.Writer) (LongReport, error) {
	say := sayer(progress)
	slots := (cfg.Running + cfg.Workers - 1) / cfg.Workers
	st, err := startStack(ctx, stackConfig{NoWorkers: true})
	if err != nil {
		return LongReport{}, err
	}
	defer st.close()
	rep := LongReport{Running: cfg.Running, Workers: cfg.Workers}

	// A sleep of an hour and a fraction no other process uses: the mark.
	mark := fmt.Sprintf("3600.%d%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if _, err := applyDef(ctx, st.JetStream(), subagent.Definition{Name: holdSubagent, Runtime: subagent.RuntimeExec, Command: []string{"/bin/sleep", mark}, Timeout: "2h"}); err != nil {
		return rep, err
	}

	dir, err := os.MkdirTemp("", "agora-bench-long-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	logf, err := os.Create(filepath.Join(dir, "workers.log"))
	if err != nil {
		return rep, err
	}
	defer logf.Close()
	var workers []*exec.Cmd
	defer func() {
		for _, w := range workers {
			_ = w.Process.Kill()
			_ = w.Wait()
		}
	}()
	say("starting %d worker processes of %d slots", cfg.Workers, slots)
	for i := range cfg.Workers {
		w := exec.Command(cfg.Exe, "service", "worker")
		w.Env = append(os.Environ(), "AGORA_NATS_URL="+st.Server().ClientURL(), "AGORA_LOG_LEVEL=warn",
			"AGORA_WORKER_ID=bench-long-"+strconv.Itoa(i), "AGORA_WORKER_CONCURRENCY="+strconv.Itoa(slots),
			"AGORA_WORKSPACE_ROOT="+filepath.Join(dir, "ws-"+strconv.Itoa(i)))
		w.Stdout, w.Stderr = logf, logf
		if err := w.Start(); err != nil {
			return rep, fmt.Errorf("bench: start worker: %w", err)
		}
		workers = append(workers, w)
	}
	pids := make([]int, len(workers))
	for i, w := range workers {
		pids[i] = w.Process.Pid
	}
	// Ready: every worker has a pull request waiting on the work queue.
	ci, err := st.JetStream().Consumer(ctx, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers)
	if err != nil {
		return rep, err
	}
	for deadline := time.Now().Add(time.Minute); ; {
		info, err := ci.Info(ctx)
		if err != nil {
			return rep, err
		}
		if info.NumWaiting >= cfg.Workers {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			return rep, fmt.Errorf("bench: %d of %d workers pulling within a minute; their log:\n%s", info.NumWaiting, cfg.Workers, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // past the workers' start-up
	rep.StartHeapMiB, rep.StartRSSMiB, _ = memory()
	rep.WorkerStartRSSMiB = procsKiB(pids, "VmRSS") / 1024

	// No run may end before the workers are killed: watched until then.
	unwatch, err := l.watch(st.nc)
	if err != nil {
		return rep, err
	}
	defer unwatch()
	var started, ended atomic.Int64
	sub, err := st.nc.Subscribe(lifecycle.SubjectLifecycleAll, func(m *nats.Msg) {
		a, err := lifecycle.ParseLifecycleSubject(m.Subject)
		switch {
		case err != nil:
		case a.Kind == lifecycle.KindStarted:
			started.Add(1)
		case a.Kind.Terminal():
			ended.Add(1)
		}
	})
	if err != nil {
		return rep, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The workers' in-progress acks ("+WPI") on the work queue's consumer.
	var beats atomic.Int64
	hb, err := st.nc.Subscribe("$JS.ACK."+lifecycle.StreamDispatch+"."+lifecycle.ConsumerWorkers+".>", func(m *nats.Msg) {
		if bytes.HasPrefix(m.Data, []byte("+WPI")) {
			beats.Add(1)
		}
	})
	if err != nil {
		return rep, err
	}
	defer func() { _ = hb.Unsubscribe() }()

	say("starting %d dispatches of a sleeping sub-agent", cfg.Running)
	t0 := time.Now()
	for i := range cfg.Running {
		if _, err := st.Client().Dispatch(ctx, lifecycle.Request{Subagent: holdSubagent, Timeout: "1h"}); err != nil {
			return rep, fmt.Errorf("dispatch %d: %w", i, err)
		}
	}
	if err := waitCount(ctx, &started, int64(cfg.Running), 5*time.Minute, "runs started"); err != nil {
		log, _ := os.ReadFile(logf.Name())
		return rep, fmt.Errorf("%w; %d ended; the workers' log:\n%s", err, ended.Load(), tail(log, 40))
	}
	rep.StartSeconds = time.Since(t0).Seconds()
	// Started is published before the runtime starts: wait until every
	// sleep is there.
	for deadline := time.Now().Add(time.Minute); len(marked(mark)) < cfg.Running; {
		if ctx.Err() != nil {
			return rep, stopped(ctx, "%d of %d sub-agents running", len(marked(mark)), cfg.Running)
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("bench: %d of %d sub-agents running within a minute of started", len(marked(mark)), cfg.Running)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	rep.HeapMiB, rep.RSSMiB, _ = memory()
	rep.WorkerRSSMiB = procsKiB(pids, "VmRSS") / 1024
	rep.WorkerRSSKiBPerRun = (rep.WorkerRSSMiB - rep.WorkerStartRSSMiB) * 1024 / float64(cfg.Running)
	runs := descendants(pids)
	rep.RunProcesses = len(runs)
	rep.RunRSSKiBPerRun = procsKiB(runs, "VmRSS") / float64(cfg.Running)
	rep.RunPSSKiBPerRun = procsPSSKiB(runs) / float64(cfg.Running)

	info, err := ci.Info(ctx)
	if err != nil {
		return rep, err
	}
	rep.HeartbeatPeriod = consume.KeepAliveEvery(info.Config.AckWait).String()
	say("all %d running; counting heartbeats and server traffic for %s", cfg.Running, cfg.Window)
	v0, err := st.Server().Varz(&server.VarzOptions{})
	if err != nil {
		return rep, err
	}
	b0, cpu0, wcpu0, rcpu0, w0 := beats.Load(), procCPU(), procsCPU(pids), procsCPU(runs), time.Now()
	select {
	case <-time.After(cfg.Window):
	case <-ctx.Done():
		return rep, stopped(ctx, "counting heartbeats")
	}
	el := time.Since(w0).Seconds()
	v1, err := st.Server().Varz(&server.VarzOptions{})
	if err != nil {
		return rep, err
	}
	rep.HeartbeatsPerSec = float64(beats.Load()-b0) / el
	rep.CPUPercent = 100 * (procCPU() - cpu0).Seconds() / el
	rep.WorkerCPUPercent = 100 * (procsCPU(pids) - wcpu0).Seconds() / el
	rep.RunCPUPercent = 100 * (procsCPU(runs) - rcpu0).Seconds() / el
	rep.ServerMsgsInPerS = float64(v1.InMsgs-v0.InMsgs) / el
	rep.ServerMsgsOutPerS = float64(v1.OutMsgs-v0.OutMsgs) / el

	unwatch()
	if err := l.err(); err != nil {
		return rep, err
	}
	say("killing the workers; their runs must go with them")
	for _, w := range workers {
		_ = w.Process.Kill()
		_ = w.Wait()
	}
	workers = nil
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		rep.LeftBehind = len(marked(mark))
		if rep.LeftBehind == 0 || time.Now().After(deadline) {
			break
		}
	}
	// No worker starts on these roots again, so the bench sweeps them as
	// one would; a workspace is swept once the last process holding its
	// lock (its launcher) is gone.
	var roots []string
	for i := range cfg.Workers {
		roots = append(roots, filepath.Join(dir, "ws-"+strconv.Itoa(i)))
	}
	rep.MountsLeft = mountsUnder(roots...)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		for _, root := range roots {
			worker.SweepWorkspaces(root, slog.New(slog.DiscardHandler))
		}
		rep.MountsAfterSweep = mountsUnder(roots...)
		if rep.MountsAfterSweep == 0 || time.Now().After(deadline) {
			break
		}
	}
	rep.PeakRSSMiB = procKiB("VmHWM") / 1024
	return rep, nil
}

// waitCount waits until n reaches want.
func waitCount(ctx context.Context, n *atomic.Int64, want int64, limit time.Duration, what string) error {
	deadline := time.Now().Add(limit)
	for n.Load() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d %s within %s", n.Load(), want, what, limit)
		}
		select {
		case <-ctx.Done():
			return stopped(ctx, "%d of %d %s", n.Load(), want, what)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// tail is the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// procStat is one process's parent, CPU time, and the CPU time of the
// children it has waited for, from /proc/PID/stat.
func procStat(pid int) (ppid int, cpu, waited time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	// Fields after the command (which may hold spaces) start after ")".
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	ticks := func(fields ...string) time.Duration {
		var sum int64
		for _, v := range fields {
			n, _ := strconv.ParseInt(v, 10, 64)
			sum += n
		}
		return clockTicks(sum)
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, ticks(f[11], f[12]), ticks(f[13], f[14]), true
}

// pids lists every process.
func pids() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if p, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// descendants lists every living process below roots.
func descendants(roots []int) []int {
	children := map[int][]int{}
	for _, p := range pids() {
		if ppid, _, _, ok := procStat(p); ok {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := append([]int{}, roots...)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// marked lists the processes whose arguments hold mark.
func marked(mark string) []int {
	var out []int
	for _, p := range pids() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline")
		if err == nil && bytes.Contains(b, []byte("\x00"+mark+"\x00")) {
			out = append(out, p)
		}
	}
	return out
}

// procsKiB sums a kB field of /proc/PID/status over the processes.
func procsKiB(ps []int, field string) float64 {
	var sum float64
	for _, p := range ps {
		sum += statusKiB("/proc/"+strconv.Itoa(p)+"/status", field)
	}
	return sum
}

// procsPSSKiB sums the processes' proportional set sizes.
func procsPSSKiB(ps []int) float64 {
	var sum float64
	for _, p := range ps {
		sum += statusKiB("/proc/"+strconv.Itoa(p)+"/smaps_rollup", "Pss")
	}
	return sum
}

// procsCPU sums the processes' CPU time; a process gone since counts 0.
func procsCPU(ps []int) time.Duration {
	var sum time.Duration
	for _, p := range ps {
		if _, cpu, _, ok := procStat(p); ok {
			sum += cpu
		}
	}
	return sum
}

// PrintLong writes the report as a table.
func PrintLong(w io.Writer, r LongReport) {
	fmt.Fprintf(w, "%d dispatches running at once on %d worker processes, all started in %.1f s\n\n", r.Running, r.Workers, r.StartSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\t")
	fmt.Fprintf(tw, "worker processes' RSS, idle → all running\t%.1f → %.1f MiB\t\n", r.WorkerStartRSSMiB, r.WorkerRSSMiB)
	fmt.Fprintf(tw, "per running dispatch, in the workers\t%.1f KiB RSS\t\n", r.WorkerRSSKiBPerRun)
	fmt.Fprintf(tw, "per running dispatch, its own processes\t%.2f processes, %.1f KiB RSS, %.1f KiB PSS\t\n",
		float64(r.RunProcesses)/float64(max(r.Running, 1)), r.RunRSSKiBPerRun, r.RunPSSKiBPerRun)
	fmt.Fprintf(tw, "this process (server, dispatcher, router, inbox): Go heap, idle → all running\t%.1f → %.1f MiB\t\n", r.StartHeapMiB, r.HeapMiB)
	fmt.Fprintf(tw, "this process: RSS, idle → all running\t%.1f → %.1f MiB\t\n", r.StartRSSMiB, r.RSSMiB)
	fmt.Fprintf(tw, "in-progress heartbeats (every %s per run)\t%.1f per second\t\n", r.HeartbeatPeriod, r.HeartbeatsPerSec)
	fmt.Fprintf(tw, "NATS server messages in / out\t%.1f / %.1f per second\t\n", r.ServerMsgsInPerS, r.ServerMsgsOutPerS)
	fmt.Fprintf(tw, "CPU while all run: this process / workers / the runs' processes\t%.2f%% / %.2f%% / %.2f%% of one core\t\n", r.CPUPercent, r.WorkerCPUPercent, r.RunCPUPercent)
	fmt.Fprintf(tw, "peak RSS of this process\t%.1f MiB\t\n", r.PeakRSSMiB)
	fmt.Fprintf(tw, "sub-agent processes left after the workers were killed\t%d\t\n", r.LeftBehind)
	fmt.Fprintf(tw, "workspace filesystems left mounted by the killed workers → after a sweep of their roots\t%d → %d\t\n", r.MountsLeft, r.MountsAfterSweep)
	_ = tw.Flush()
}

// mountsUnder counts the mounts of this mount namespace below the roots.
func mountsUnder(roots ...string) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		for _, root := range roots {
			if strings.HasPrefix(f[4], root+"/") {
				n++
				break
			}
		}
	}
	return n
}

// clockTicks converts the kernel's clock ticks (/proc's CPU times) to a
// duration: USER_HZ is 100 on Linux.
func clockTicks(n int64) time.Duration { return time.Duration(n) * time.Second / 100 }
