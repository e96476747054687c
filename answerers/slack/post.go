package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	slackapi "github.com/slack-go/slack"

	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// pull handles the route's asked events one at a time until ctx ends.
// The posts use workCtx, which gets the shutdown timeout (Run).
func (s *Server) pull(ctx context.Context, route string, c jetstream.Consumer) {
	_ = consume.Run(ctx, c, func(_ context.Context, m jetstream.Msg) consume.Verdict {
		return s.handle(s.workCtx, route, m)
	}, consume.Options{
		PullExpiry: 5 * time.Second, KeepAlive: consume.KeepAliveEvery(questionAckWait),
		ShutdownTimeout: -1, Logger: s.log.With("route", route),
	})
}

// handle posts the question of an asked event, or declines it when it
// cannot be posted.
func (s *Server) handle(ctx context.Context, route string, m jetstream.Msg) consume.Verdict {
	q, _, err := answerer.DecodeQuestion(m)
	if err != nil {
		s.log.Error("undecodable question terminated", "subject", m.Subject(), "err", err)
		return consume.Term("")
	}
	if q.Event != lifecycle.QuestionAsked {
		return consume.DoubleAck()
	}
	log := s.log.With("route", route, "question_id", q.QuestionID, "thread_id", q.ThreadID)
	rec, err := s.record(ctx, q.QuestionID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return consume.DoubleAck()
	case err != nil:
		log.Warn("question record unreadable; will retry", "err", err)
		return consume.Nak(2 * time.Second)
	case rec.Status != "asked" || rec.Route != route:
		log.Debug("question no longer waits on this route: skipped")
		return consume.DoubleAck()
	}
	if old, ok := s.index.get(msgKey(route, q.QuestionID)); ok && old.Escalation >= rec.Escalation {
		return consume.DoubleAck() // posted already (a redelivery)
	}
	rs := s.settings.Routes[route]
	dest, why := rs.destination(rec.Labels)
	if dest == "" {
		s.metrics.postFailures.WithLabelValues(route, "no_destination").Inc()
		log.Warn("no Slack destination: declining", "reason", why)
		return s.decline(ctx, route, rec, "slack: "+why)
	}

	var channel, ts string
	err = s.api.call(ctx, "chat.postMessage", s.api.attempts, func(ctx context.Context) error {
		var err error
		channel, ts, err = s.api.c.PostMessageContext(ctx, dest,
			slackapi.MsgOptionText(fallbackText(rec), true),
			slackapi.MsgOptionBlocks(s.askedBlocks(rec, time.Now())...))
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return consume.Nak(time.Second) // stopping: post it after the restart
		}
		s.metrics.postFailures.WithLabelValues(route, "api").Inc()
		log.Error("question not posted to Slack: declining to the route's fallback", "destination", dest, "err", err)
		return s.decline(ctx, route, rec, fmt.Sprintf("slack: the message could not be posted: %v", err))
	}
	s.metrics.posted.WithLabelValues(route).Inc()
	entry := message{QuestionID: q.QuestionID, Route: route, Channel: channel, TS: ts, Escalation: rec.Escalation, PostedAt: time.Now().UTC(), Shown: rec.ShownDigest,
		Threads: threadsWaiting(rec)}
	b, _ := json.Marshal(entry)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rev, err := s.messages.Put(pctx, msgKey(route, q.QuestionID), b)
	cancel()
	if err != nil {
		// The message exists but is not remembered: it would never be
		// updated. Post again later rather than leave a stale copy.
		log.Error("message posted but not recorded; will post again", "channel", channel, "ts", ts, "err", err)
		return consume.Nak(5 * time.Second)
	}
	s.index.put(msgKey(route, q.QuestionID), entry, rev)
	log.Info("question posted to Slack", "channel", channel, "ts", ts)
	// Answered or moved while it was being posted: the watch may have
	// passed it already, so look again now.
	s.enqueue(q.QuestionID)
	return consume.DoubleAck()
}

// record reads a question's record.
func (s *Server) record(ctx context.Context, qid string) (*lifecycle.Question, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e, err := s.questions.Get(ctx, qid)
	if err != nil {
		return nil, err
	}
	var q lifecycle.Question
	if err := json.Unmarshal(e.Value(), &q); err != nil {
		return nil, fmt.Errorf("slack: question record %s: %w", qid, err)
	}
	return &q, nil
}

// decline sends the question to the route's fallback through the route's
// answer endpoint, with the body pkg/answerer sends for a decline.
func (s *Server) decline(ctx context.Context, route string, q *lifecycle.Question, reason string) consume.Verdict {
	subject, err := lifecycle.APIAnswerRoute(route)
	if err != nil {
		return consume.Term("")
	}
	reason, _ = truncate(reason, 1000)
	body, _ := json.Marshal(struct {
		QuestionID string `json:"question_id"`
		Route      string `json:"route"`
		AnsweredBy string `json:"answered_by"`
		Decline    bool   `json:"decline"`
		Reason     string `json:"reason"`
	}{q.QuestionID, route, "answerer:slack", true, reason})
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msg, err := s.nc.RequestWithContext(rctx, subject, body)
	var rep client.AnswerReply
	if err == nil {
		err = json.Unmarshal(msg.Data, &rep)
	}
	if err != nil || rep.Status == client.AnswerRetry || rep.Status == "" {
		s.log.Warn("decline not delivered; will retry", "route", route, "question_id", q.QuestionID, "err", err, "status", rep.Status)
		return consume.Nak(5 * time.Second)
	}
	s.log.Info("question declined", "route", route, "question_id", q.QuestionID, "status", rep.Status, "reason", rep.Reason)
	return consume.DoubleAck()
}
