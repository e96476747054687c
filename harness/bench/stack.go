package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
	"github.com/agora-dispatch/agora/stack"
)

// askingSubagent is the sub-agent of the scale scenarios: its runtime
// (askingRuntime, in process) asks on round 0 and finishes on round 1.
const askingSubagent = "bench-asker"

// askingRuntime asks on round 0 and finishes on round 1, in process.
// Each thread asks its own question: the same one from every thread would
// be asked once for all of them (docs/router.md, "Ask once"), which is what
// coalesceRuntime measures, not these scenarios.
type askingRuntime struct{}

func (askingRuntime) Run(_ context.Context, inv worker.Invocation) worker.Result {
	if inv.Request.Round == 0 {
		if err := sentinel.Write(inv.Workspace, sentinel.Request{Question: "A or B? (thread " + inv.Request.ThreadID + ")", Options: []string{"A", "B"}, Kind: sentinel.KindDecision}); err != nil {
			return worker.Result{ExitCode: -1, Err: err}
		}
	}
	return worker.Result{}
}

// scale is the whole of Agora in this process, as `agora dev` runs it —
// dispatcher, worker, router and inbox — on an embedded file-store server
// of its own (stack.Start), for the scale scenarios.
type scale struct {
	*stack.Stack
	nc    *nats.Conn // the scenario's own connection
	close func()
}

type stackConfig struct {
	Slots     int              // worker slots
	Retention time.Duration    // 0: the default
	Runtime   worker.InProcess // the sub-agent's runtime; default askingRuntime
	Workers   int              // worker services, each with Slots; default 1
	// NoWorkers leaves the workers out: the scenario runs its own.
	NoWorkers bool
	// Extra are more services to run beside Agora's, given the stack's
	// client and a quiet logger (an answerer).
	Extra []func(ctx context.Context, c *client.Client, log *slog.Logger) error
}

// startStack starts the stack and returns when every service is ready.
func startStack(ctx context.Context, cfg stackConfig) (*scale, error) {
	dir, err := os.MkdirTemp("", "agora-bench-scale-")
	if err != nil {
		return nil, err
	}
	o := stack.Options{
		Server:     natsserver.Config{Port: -1, StoreDir: dir},
		Provision:  &provision.Config{Retention: cfg.Retention},
		Subagents:  []subagent.Definition{{Name: askingSubagent, Runtime: subagent.RuntimeExec, Command: []string{"in-process"}}},
		Dispatcher: &dispatcher.Config{ID: "bench-scale", Retention: cfg.Retention},
		Router:     &router.Config{ID: "bench-scale", Retention: cfg.Retention},
		Inbox:      &inbox.Config{DevToken: true},
		InProcess:  map[string]worker.InProcess{subagent.RuntimeExec: cfg.Runtime},
	}
	if cfg.Runtime == nil {
		o.InProcess[subagent.RuntimeExec] = askingRuntime{}
	}
	if !cfg.NoWorkers {
		for i := range max(cfg.Workers, 1) {
			o.Workers = append(o.Workers, worker.Config{Concurrency: cfg.Slots, WorkspaceRoot: fmt.Sprintf("%s/ws-%d", dir, i),
				ID: fmt.Sprintf("bench-scale-%d", i), PullExpiry: 500 * time.Millisecond})
		}
	}
	st, err := stack.Start(ctx, o)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	nc, err := nats.Connect(st.URL())
	if err != nil {
		_ = st.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	quiet := slog.New(slog.DiscardHandler)
	for i, extra := range cfg.Extra {
		st.Go(fmt.Sprintf("extra-%d", i), func(ctx context.Context) error { return extra(ctx, st.Client(), quiet) })
	}
	return &scale{Stack: st, nc: nc, close: func() {
		nc.Close()
		_ = st.Close()
		os.RemoveAll(dir)
	}}, nil
}

// bucketKeys counts the keys of a KV bucket.
func (st *scale) bucketKeys(ctx context.Context, bucket string) (uint64, error) {
	s, err := st.JetStream().Stream(ctx, "KV_"+bucket)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.NumSubjects, nil
}

// memory is the process's Go heap in use and RSS (MiB) after a collection,
// and its goroutines.
func memory() (heapMiB, rssMiB float64, goroutines int) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return mib(ms.HeapInuse), procKiB("VmRSS") / 1024, runtime.NumGoroutine()
}

// idleCPU is the process's CPU over d with nothing to do, in percent of one
// core.
func idleCPU(d time.Duration) float64 {
	cpu0, wall0 := procCPU(), time.Now()
	time.Sleep(d)
	return 100 * (procCPU() - cpu0).Seconds() / time.Since(wall0).Seconds()
}

// applyDef registers d through the client, as `agora subagent apply` does,
// and returns its revision.
func applyDef(ctx context.Context, js jetstream.JetStream, d subagent.Definition) (uint64, error) {
	c, err := client.New(js.Conn())
	if err != nil {
		return 0, err
	}
	a, err := c.ApplySubagent(ctx, d)
	return a.Revision, err
}
