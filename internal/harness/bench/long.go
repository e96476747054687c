package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/internal/inprogress"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// LongConfig sizes `agora bench --scale long`: Running dispatches run at
// once, each holding its slot (a sleeping sub-agent), spread over Workers
// worker services; the scenario measures what a running dispatch costs
// while nothing else happens.
type LongConfig struct {
	Running int           // default 1000
	Workers int           // default 4
	Window  time.Duration // how long the heartbeats are counted; default 30s
}

// LongReport is the scenario's result.
type LongReport struct {
	Running int `json:"running"`
	Workers int `json:"workers"`
	// Memory of the whole process before and with every dispatch running,
	// and the difference per running dispatch.
	StartHeapMiB      float64 `json:"start_heap_inuse_mib"`
	StartRSSMiB       float64 `json:"start_rss_mib"`
	HeapMiB           float64 `json:"heap_inuse_mib"`
	RSSMiB            float64 `json:"rss_mib"`
	HeapKiBPerRun     float64 `json:"heap_kib_per_running_dispatch"`
	RSSKiBPerRun      float64 `json:"rss_kib_per_running_dispatch"`
	GoroutinesPerRun  float64 `json:"goroutines_per_running_dispatch"`
	StartSeconds      float64 `json:"start_seconds"` // dispatch → every run started
	HeartbeatsPerSec  float64 `json:"heartbeats_per_second"`
	HeartbeatPeriod   string  `json:"heartbeat_period"`
	ServerMsgsInPerS  float64 `json:"server_msgs_in_per_second"`
	ServerMsgsOutPerS float64 `json:"server_msgs_out_per_second"`
	CPUPercent        float64 `json:"cpu_percent"` // of one core, over the window
	PeakRSSMiB        float64 `json:"peak_rss_mib"`
}

// holdRuntime holds its slot until release closes (or the run is stopped).
type holdRuntime struct{ release <-chan struct{} }

func (r holdRuntime) Run(ctx context.Context, _ worker.Invocation) worker.Result {
	select {
	case <-r.release:
	case <-ctx.Done():
	}
	return worker.Result{}
}

// Long runs the long-runs scenario on the whole of Agora in this process
// (worker services in one process, not separate ones).
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
	say := sayer(progress)
	release := make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	slots := (cfg.Running + cfg.Workers - 1) / cfg.Workers
	st, err := startStack(ctx, stackConfig{Slots: slots, Workers: cfg.Workers, Runtime: holdRuntime{release: release}})
	if err != nil {
		return LongReport{}, err
	}
	defer st.close()
	rep := LongReport{Running: cfg.Running, Workers: cfg.Workers}
	var g0 int
	rep.StartHeapMiB, rep.StartRSSMiB, g0 = memory()

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

	say("starting %d dispatches that hold their slots, on %d workers of %d slots", cfg.Running, cfg.Workers, slots)
	t0 := time.Now()
	for i := range cfg.Running {
		if _, err := st.client.Dispatch(ctx, lifecycle.Request{Subagent: askingSubagent, Timeout: "1h"}); err != nil {
			return rep, fmt.Errorf("dispatch %d: %w", i, err)
		}
	}
	if err := waitCount(ctx, &started, int64(cfg.Running), 2*time.Minute, "runs started"); err != nil {
		return rep, err
	}
	rep.StartSeconds = time.Since(t0).Seconds()
	time.Sleep(time.Second)
	var g int
	rep.HeapMiB, rep.RSSMiB, g = memory()
	rep.HeapKiBPerRun = (rep.HeapMiB - rep.StartHeapMiB) * 1024 / float64(cfg.Running)
	rep.RSSKiBPerRun = (rep.RSSMiB - rep.StartRSSMiB) * 1024 / float64(cfg.Running)
	rep.GoroutinesPerRun = float64(g-g0) / float64(cfg.Running)

	ci, err := st.js.Consumer(ctx, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers)
	if err != nil {
		return rep, err
	}
	info, err := ci.Info(ctx)
	if err != nil {
		return rep, err
	}
	rep.HeartbeatPeriod = inprogress.Period(info.Config.AckWait).String()
	say("all %d running; counting heartbeats and server traffic for %s", cfg.Running, cfg.Window)
	v0, err := st.srv.Varz(&server.VarzOptions{})
	if err != nil {
		return rep, err
	}
	b0, cpu0, w0 := beats.Load(), procCPU(), time.Now()
	select {
	case <-time.After(cfg.Window):
	case <-ctx.Done():
		return rep, ctx.Err()
	}
	el := time.Since(w0).Seconds()
	v1, err := st.srv.Varz(&server.VarzOptions{})
	if err != nil {
		return rep, err
	}
	rep.HeartbeatsPerSec = float64(beats.Load()-b0) / el
	rep.CPUPercent = 100 * (procCPU() - cpu0).Seconds() / el
	rep.ServerMsgsInPerS = float64(v1.InMsgs-v0.InMsgs) / el
	rep.ServerMsgsOutPerS = float64(v1.OutMsgs-v0.OutMsgs) / el

	say("releasing the runs")
	releaseOnce.Do(func() { close(release) })
	if err := waitCount(ctx, &ended, int64(cfg.Running), 2*time.Minute, "runs ended"); err != nil {
		return rep, err
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
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// PrintLong writes the report as a table.
func PrintLong(w io.Writer, r LongReport) {
	fmt.Fprintf(w, "%d dispatches running at once on %d workers (in this process), all started in %.1f s\n\n", r.Running, r.Workers, r.StartSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\t")
	fmt.Fprintf(tw, "Go heap in use, idle → all running\t%.1f → %.1f MiB\t\n", r.StartHeapMiB, r.HeapMiB)
	fmt.Fprintf(tw, "RSS, idle → all running\t%.1f → %.1f MiB\t\n", r.StartRSSMiB, r.RSSMiB)
	fmt.Fprintf(tw, "per running dispatch\t%.1f KiB heap, %.1f KiB RSS, %.1f goroutines\t\n", r.HeapKiBPerRun, r.RSSKiBPerRun, r.GoroutinesPerRun)
	fmt.Fprintf(tw, "in-progress heartbeats (every %s per run)\t%.1f per second\t\n", r.HeartbeatPeriod, r.HeartbeatsPerSec)
	fmt.Fprintf(tw, "NATS server messages in / out\t%.1f / %.1f per second\t\n", r.ServerMsgsInPerS, r.ServerMsgsOutPerS)
	fmt.Fprintf(tw, "CPU while all run\t%.2f%% of one core\t\n", r.CPUPercent)
	fmt.Fprintf(tw, "peak RSS\t%.1f MiB\t\n", r.PeakRSSMiB)
	_ = tw.Flush()
}
