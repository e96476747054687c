package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/stack"
)

// statusDispatches is how many ended dispatches the status rows read, in
// turn.
const statusDispatches = 64

// statusRead measures a dispatch's status as the doors answer it — its
// record and, since issue 31's step 5, its chain's last events, read
// beside the record for a root (docs/design.md §2, "The dispatch record
// and the reconciler") — through agora.api.status, against its raw
// baseline: a get of the same records from agora_dispatches. It returns
// the two scenarios, baseline first, and a stop function.
func statusRead(ctx context.Context, url string, js jetstream.JetStream) ([2]scenario, func(), error) {
	def := subagent.Definition{Name: "bench-status", Runtime: subagent.RuntimeExec, Command: []string{"/bin/true"}}
	if _, err := applyDef(ctx, js, def); err != nil {
		return [2]scenario{}, nil, err
	}
	st, err := stack.Start(ctx, stack.Options{URL: url, ReadyTimeout: 30 * time.Second,
		Dispatcher: &dispatcher.Config{ID: "bench-status", ReconcileLookback: reconcileLookback}})
	if err != nil {
		return [2]scenario{}, nil, err
	}
	c := st.Client()
	// Ended root dispatches: accepted by the dispatcher, started and
	// finished as a worker publishes them.
	ids := make([]string, statusDispatches)
	for i := range ids {
		d, err := c.Dispatch(ctx, lifecycle.Request{Subagent: def.Name, Input: json.RawMessage(`{}`)})
		if err != nil {
			_ = st.Close()
			return [2]scenario{}, nil, err
		}
		ids[i] = d.DispatchID
		for _, ev := range []lifecycle.Lifecycle{
			&lifecycle.Started{Common: d.Record.Common(), WorkerID: "bench", Attempt: 1},
			&lifecycle.Finished{Common: d.Record.Common(), Output: json.RawMessage(`{"ok":true}`)},
		} {
			_, msg, err := lifecycle.Message(lifecycle.Source("worker", "bench"), ev)
			if err == nil {
				_, err = js.PublishMsg(ctx, msg)
			}
			if err != nil {
				_ = st.Close()
				return [2]scenario{}, nil, err
			}
		}
	}
	if err := projectionCaughtUp(ctx, js, 60*time.Second); err != nil {
		_ = st.Close()
		return [2]scenario{}, nil, err
	}
	kv, err := js.KeyValue(ctx, lifecycle.BucketDispatches)
	if err != nil {
		_ = st.Close()
		return [2]scenario{}, nil, err
	}
	var next atomic.Uint64
	pick := func() string { return ids[next.Add(1)%statusDispatches] }
	raw := scenario{name: "raw KV get of a dispatch record (the status rows' baseline)", do: func(ctx context.Context, _ string) error {
		_, err := kv.Get(ctx, pick())
		return err
	}}
	agora := scenario{name: "agora status (agora.api.status) of an ended dispatch: its record and its chain", do: func(ctx context.Context, _ string) error {
		id := pick()
		rec, err := c.Status(ctx, id)
		if err == nil && rec.Status != lifecycle.KindFinished {
			err = fmt.Errorf("status of %s: %s, want finished", id, rec.Status)
		}
		return err
	}}
	return [2]scenario{raw, agora}, func() { _ = st.Close() }, nil
}
