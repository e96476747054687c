package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// maxDeliveriesSubject is the advisory JetStream sends when a work message
// reaches MaxDeliver on the workers consumer.
var maxDeliveriesSubject = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + lifecycle.StreamDispatch + "." + lifecycle.ConsumerWorkers

// onMaxDeliveries ends a dispatch whose workers kept dying: it publishes
// `failed` redelivery-exhausted (unless the dispatch is already terminal)
// and removes the dead message from the work queue.
func (s *Service) onMaxDeliveries(m *nats.Msg) {
	var adv struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries int    `json:"deliveries"`
	}
	if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
		s.log.Warn("unreadable max-deliveries advisory", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := s.log.With("stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries)
	raw, err := s.dispatch.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		log.Warn("max deliveries: work message not found", "err", err)
		return
	}
	ev, err := lifecycle.Decode(raw.Header, raw.Data)
	var d lifecycle.Data
	if err == nil {
		d, err = lifecycle.Parse(ev)
	}
	req, ok := d.(*lifecycle.Request)
	if err != nil || !ok || lifecycle.ValidToken(req.DispatchID) != nil {
		log.Error("max deliveries: undecodable work message removed", "err", err)
		_ = s.dispatch.DeleteMsg(ctx, adv.StreamSeq)
		return
	}
	if req.ThreadID == "" {
		req.ThreadID = req.DispatchID
	}
	c := lifecycle.Common{DispatchID: req.DispatchID, ThreadID: req.ThreadID, ParentID: req.ParentID, Round: req.Round, Subagent: req.Subagent}
	j := &job{req: req, common: c, trace: lifecycle.Traceparent(ev), log: log.With("dispatch_id", req.DispatchID, "thread_id", req.ThreadID)}
	// From the leader: a publish refused below is taken as the dispatch
	// having moved on, so the read must not be a lagging replica's.
	last, err := s.lastEventOnLeader(ctx, c)
	if err != nil {
		j.log.Warn("max deliveries: cannot read the dispatch's events", "err", err)
		return
	}
	if !last.kind.Terminal() {
		// Fenced like a run's terminal event: a stale run that wakes up
		// later cannot end the dispatch a second time.
		j.fence = last.seq
		f := &lifecycle.Failed{Common: c, Reason: lifecycle.ReasonRedeliveryExhausted,
			Detail: fmt.Sprintf("delivered %d times without finishing: workers kept dying or stopped acknowledging", adv.Deliveries)}
		stored, now, err := s.publishFenced(ctx, j, f)
		switch {
		case err != nil:
			j.log.Error("max deliveries: publish failed event", "err", err)
			return
		case stored:
			s.metrics.outcome(lifecycle.KindFailed, lifecycle.ReasonRedeliveryExhausted)
			j.log.Warn("dispatch ended", "kind", lifecycle.KindFailed, "reason", lifecycle.ReasonRedeliveryExhausted)
		default:
			j.log.Info("max deliveries: the dispatch moved on meanwhile", "kind", now.kind)
		}
	}
	if err := s.dispatch.DeleteMsg(ctx, adv.StreamSeq); err != nil {
		j.log.Warn("max deliveries: remove work message", "err", err)
	}
}
