package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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
)

// askingSubagent is the sub-agent of the scale scenarios: its runtime
// (askingRuntime, in process) asks on round 0 and finishes on round 1.
const askingSubagent = "bench-asker"

// askingRuntime asks on round 0 and finishes on round 1, in process.
type askingRuntime struct{}

func (askingRuntime) Run(_ context.Context, inv worker.Invocation) worker.Result {
	if inv.Request.Round == 0 {
		if err := sentinel.Write(inv.Workspace, sentinel.Request{Question: "A or B?", Options: []string{"A", "B"}, Kind: sentinel.KindDecision}); err != nil {
			return worker.Result{ExitCode: -1, Err: err}
		}
	}
	return worker.Result{}
}

// stack is the whole of Agora in this process, as `agora dev` runs it —
// dispatcher, worker, router and inbox — on an embedded file-store server
// of its own, for the scale scenarios.
type stack struct {
	srv    *server.Server
	js     jetstream.JetStream
	nc     *nats.Conn // the scenario's own connection
	client *client.Client
	inbox  *inbox.Server
	close  func()
}

type stackConfig struct {
	Slots     int            // worker slots
	Retention time.Duration  // 0: the default
	Runtime   worker.Runtime // the sub-agent's runtime; default askingRuntime
	Workers   int            // worker services, each with Slots; default 1
	// NoWorkers leaves the workers out: the scenario runs its own.
	NoWorkers bool
	// Extra are more services to run beside Agora's, given the stack's
	// client and a quiet logger (an answerer).
	Extra []func(ctx context.Context, c *client.Client, log *slog.Logger) error
}

// startStack starts the stack and returns when every service is ready.
func startStack(ctx context.Context, cfg stackConfig) (_ *stack, err error) {
	st := &stack{}
	var cleanups []func()
	st.close = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	dir, err := os.MkdirTemp("", "agora-bench-scale-")
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	srv, err := natsserver.Start(natsserver.Config{Port: -1, StoreDir: dir})
	if err != nil {
		return nil, err
	}
	st.srv = srv
	cleanups = append(cleanups, func() { srv.Shutdown(); srv.WaitForShutdown() })
	conn := func() (*nats.Conn, error) {
		nc, err := nats.Connect(srv.ClientURL())
		if err == nil {
			cleanups = append(cleanups, nc.Close)
		}
		return nc, err
	}
	if st.nc, err = conn(); err != nil {
		return nil, err
	}
	if st.js, err = jetstream.New(st.nc); err != nil {
		return nil, err
	}
	if err := provision.Ensure(ctx, st.js, provision.Config{Retention: cfg.Retention}); err != nil {
		return nil, err
	}
	if _, err := applyDef(ctx, st.js, subagent.Definition{Name: askingSubagent, Runtime: subagent.RuntimeExec, Command: []string{"in-process"}}); err != nil {
		return nil, err
	}

	if cfg.Runtime == nil {
		cfg.Runtime = askingRuntime{}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var services []func(context.Context) error
	var readies []<-chan struct{}
	workers := max(cfg.Workers, 1)
	if cfg.NoWorkers {
		workers = 0
	}
	for i := range workers {
		wnc, err := conn()
		if err != nil {
			return nil, err
		}
		w, err := worker.New(worker.Config{Concurrency: cfg.Slots, WorkspaceRoot: fmt.Sprintf("%s/ws-%d", dir, i), ID: fmt.Sprintf("bench-scale-%d", i), PullExpiry: 500 * time.Millisecond},
			worker.Deps{Conn: wnc, Logger: quiet, Runtimes: map[string]worker.Runtime{subagent.RuntimeExec: cfg.Runtime}})
		if err != nil {
			return nil, err
		}
		services = append(services, w.Run)
	}
	dnc, err := conn()
	if err != nil {
		return nil, err
	}
	d, err := dispatcher.New(dispatcher.Config{ID: "bench-scale", Retention: cfg.Retention}, dispatcher.Deps{Conn: dnc, Logger: quiet})
	if err != nil {
		return nil, err
	}
	services, readies = append(services, d.Run), append(readies, d.Ready())
	rnc, err := conn()
	if err != nil {
		return nil, err
	}
	r, err := router.New(router.Config{ID: "bench-scale"}, router.Deps{Conn: rnc, Logger: quiet})
	if err != nil {
		return nil, err
	}
	services, readies = append(services, r.Run), append(readies, r.Ready())
	inc, err := conn()
	if err != nil {
		return nil, err
	}
	if st.inbox, err = inbox.New(inbox.Config{DevToken: true}, inbox.Deps{Conn: inc, Logger: quiet}); err != nil {
		return nil, err
	}
	services, readies = append(services, st.inbox.Run), append(readies, st.inbox.Ready())
	cnc, err := conn()
	if err != nil {
		return nil, err
	}
	if st.client, err = client.New(cnc); err != nil {
		return nil, err
	}
	for _, extra := range cfg.Extra {
		services = append(services, func(ctx context.Context) error { return extra(ctx, st.client, quiet) })
	}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for _, run := range services {
		wg.Go(func() { _ = run(sctx) })
	}
	cleanups = append(cleanups, func() { stop(); wg.Wait() })
	for _, ready := range readies {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Minute):
			return nil, errors.New("bench: a service was not ready within a minute")
		}
	}
	return st, nil
}

// bucketKeys counts the keys of a KV bucket.
func (st *stack) bucketKeys(ctx context.Context, bucket string) (uint64, error) {
	s, err := st.js.Stream(ctx, "KV_"+bucket)
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
