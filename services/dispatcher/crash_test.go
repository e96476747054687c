package dispatcher_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/crashpoint"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// TestMain doubles as the dispatcher program when DISPATCHER_TEST_MAIN=1,
// so a test can have a real dispatcher process killed at a crash point.
func TestMain(m *testing.M) {
	if os.Getenv("DISPATCHER_TEST_MAIN") == "1" {
		os.Exit(dispatcherMain())
	}
	os.Exit(m.Run())
}

func dispatcherMain() int {
	return testkit.ServiceMain(func(cfg dispatcher.Config, log *slog.Logger) (*dispatcher.Service, error) {
		return dispatcher.New(cfg, dispatcher.Deps{Logger: log})
	})
}

// A dispatcher killed with a dispatch's accepted event stored and its work
// not yet published (the crash point dispatcher.accepted) leaves a record
// whose work is not queued. A retry with the dispatch's id, or the reconciler,
// completes it: one accepted event, one work message naming its sequence
// (docs/worker.md#fencing).
func TestDispatcherKilledBetweenAcceptedAndWork(t *testing.T) {
	for _, tc := range []struct {
		name  string
		retry bool // the client retries; otherwise the reconciler completes it
	}{
		{name: "a retry with the id", retry: true},
		{name: "the reconciler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, dispatcher.Config{})
			h.stop()
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "DISPATCHER_TEST_MAIN=1", "AGORA_NATS_URL="+h.srv.URL, "AGORA_DISPATCHER_ID=victim",
				crashpoint.Env+"="+crashpoint.DispatcherAccepted+":1")
			var logs bytes.Buffer
			cmd.Stdout, cmd.Stderr = &logs, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() { _ = cmd.Process.Kill() })

			id := lifecycle.NewID()
			req := lifecycle.Request{DispatchID: id, Subagent: "planner"}
			ctx, cancel := context.WithTimeout(t.Context(), waitFor)
			_, err := h.cl.Dispatch(ctx, req) // its dispatcher dies on the way
			cancel()
			if err == nil {
				t.Fatal("the dispatch was answered although its dispatcher was to die before queueing it")
			}
			select {
			case err := <-exited:
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL || !strings.Contains(logs.String(), "agora crash point: "+crashpoint.DispatcherAccepted) {
					t.Fatalf("dispatcher ended %v, want killed at the crash point; its log:\n%s", err, logs.String())
				}
			case <-time.After(waitFor):
				t.Fatalf("the dispatcher was not killed at the crash point; its log:\n%s", logs.String())
			}
			if n := len(workMessages(t, h)); n != 0 {
				t.Fatalf("%d work messages before the acceptance was completed, want 0", n)
			}

			if tc.retry {
				h.start(dispatcher.Config{})
				if _, err := h.cl.Dispatch(t.Context(), req); err != nil {
					t.Fatalf("retry with the id: %v", err)
				}
			} else {
				h.start(dispatcher.Config{ReconcileGrace: 200 * time.Millisecond})
			}
			h.eventually("the work queued", func() bool { return len(workMessages(t, h)) > 0 })

			accepted := natstest.Stored(t, h.js, lifecycle.StreamLifecycle, lifecycle.LifecycleFilter(lifecycle.KindAccepted, "", id))
			if len(accepted) != 1 {
				t.Fatalf("%d accepted events, want 1", len(accepted))
			}
			md, err := accepted[0].Metadata()
			if err != nil {
				t.Fatal(err)
			}
			work := workMessages(t, h)
			if len(work) != 1 || work[0].Header.Get(lifecycle.AcceptedSeqHeader) != strconv.FormatUint(md.Sequence.Stream, 10) {
				t.Fatalf("work messages %d, the first naming %v; want one naming the accepted event's sequence %d", len(work), headerOf(work), md.Sequence.Stream)
			}
		})
	}
}

func headerOf(work []*jetstream.RawStreamMsg) string {
	if len(work) == 0 {
		return "none"
	}
	return work[0].Header.Get(lifecycle.AcceptedSeqHeader)
}
