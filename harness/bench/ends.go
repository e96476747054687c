package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// No scenario here cancels a dispatch, gives a question a deadline or
// takes a thread past its max_rounds, and their runtimes cannot fail: a
// dispatch that ends failed or cancelled is lost work, never a round trip
// or a thread done. lost watches for such ends; the first stops the
// scenario (bounded), which then returns an error naming each one seen.

// lost records the dispatches of a scenario that ended failed or
// cancelled. Its methods are safe for concurrent use.
type lost struct {
	stop context.CancelCauseFunc // the scenario's
	mu   sync.Mutex
	ends []string
}

// errLost is the cause of a scenario stopped by a lost dispatch.
var errLost = errors.New("bench: a dispatch ended failed or cancelled")

// maxNamed is how many lost dispatches an error names one by one.
const maxNamed = 10

// detailLen bounds a failure's detail in an error.
const detailLen = 300

// watch subscribes on nc to every failed and cancelled event and notes
// each; the caller calls the returned function to stop watching.
func (l *lost) watch(nc *nats.Conn) (func(), error) {
	var subs []*nats.Subscription
	unsub := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, k := range []lifecycle.Kind{lifecycle.KindFailed, lifecycle.KindCancelled} {
		s, err := nc.Subscribe(lifecycle.LifecycleFilter(k, "", ""), func(m *nats.Msg) { l.note(m) })
		if err != nil {
			unsub()
			return nil, fmt.Errorf("bench: watch %s events: %w", k, err)
		}
		subs = append(subs, s)
	}
	// Subscribed on the server before the scenario dispatches anything.
	if err := nc.Flush(); err != nil {
		unsub()
		return nil, err
	}
	return unsub, nil
}

// note records the failed or cancelled event m and stops the scenario.
func (l *lost) note(m *nats.Msg) {
	l.mu.Lock()
	l.ends = append(l.ends, describeEnd(m))
	l.mu.Unlock()
	l.stop(errLost)
}

// err names the lost dispatches, nil when there were none.
func (l *lost) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ends) == 0 {
		return nil
	}
	named := l.ends[:min(len(l.ends), maxNamed)]
	more := ""
	if n := len(l.ends) - len(named); n > 0 {
		more = fmt.Sprintf("; and %d more", n)
	}
	return fmt.Errorf("bench: %d dispatches ended failed or cancelled, which nothing here should: %s%s", len(l.ends), strings.Join(named, "; "), more)
}

// describeEnd names a failed or cancelled event: dispatch, thread, reason
// and detail (or who cancelled and why), worker and attempt.
func describeEnd(m *nats.Msg) string {
	e, err := lifecycle.Decode(m.Header, m.Data)
	if err != nil {
		return fmt.Sprintf("%s (undecodable: %v)", m.Subject, err)
	}
	d, err := lifecycle.Parse(e)
	if err != nil {
		return fmt.Sprintf("%s (unparsable: %v)", m.Subject, err)
	}
	switch v := d.(type) {
	case *lifecycle.Failed:
		return fmt.Sprintf("dispatch %s (thread %s, round %d) failed %s on worker %q, attempt %d: %s",
			v.DispatchID, v.ThreadID, v.Round, v.Reason, v.WorkerID, v.Attempt, lifecycle.Clip(v.Detail, detailLen))
	case *lifecycle.Cancelled:
		return fmt.Sprintf("dispatch %s (thread %s, round %d) cancelled by %q (%q) on worker %q, attempt %d",
			v.DispatchID, v.ThreadID, v.Round, v.By, v.Reason, v.WorkerID, v.Attempt)
	}
	return fmt.Sprintf("%s: %T", m.Subject, d)
}

// bounded runs a scenario named name with its context bounded by limit
// and stopped at the first dispatch lost (run watches for them with the
// lost it is given). It returns run's report and its error, which the lost
// dispatches replace (or join, when run failed for a reason of its own)
// and which names the deadline when that passed.
func bounded[R any](ctx context.Context, name string, limit time.Duration, run func(context.Context, *lost) (R, error)) (R, error) {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	late := fmt.Errorf("bench: %s not done within its deadline of %s (--deadline)", name, limit)
	ctx, cancel := context.WithTimeoutCause(ctx, limit, late)
	defer cancel()
	l := &lost{stop: stop}
	rep, err := run(ctx, l)
	if lerr := l.err(); lerr != nil {
		if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, errLost) {
			return rep, lerr
		}
		return rep, errors.Join(lerr, err)
	}
	if err != nil && errors.Is(context.Cause(ctx), late) && !errors.Is(err, late) {
		err = fmt.Errorf("%w: %w", late, err)
	}
	return rep, err
}

// stopped is what a scenario waiting on ctx returns when it ended: its
// cause (the deadline, a lost dispatch) with what the scenario was
// waiting for.
func stopped(ctx context.Context, waiting string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(waiting, a...), context.Cause(ctx))
}
