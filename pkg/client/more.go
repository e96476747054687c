package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Terminal returns a dispatch's terminal event data (*lifecycle.Finished,
// *NeedsInput, *Failed or *Cancelled), read from AGORA_LIFECYCLE; it
// returns ErrNotEnded while the dispatch runs and ErrNotFound for an
// unknown dispatch.
func (c *Client) Terminal(ctx context.Context, dispatchID string) (lifecycle.Data, error) {
	rec, err := c.Status(ctx, dispatchID)
	if err != nil {
		return nil, err
	}
	return c.terminalData(ctx, rec.ThreadID, dispatchID)
}

// MaxPartialState bounds PartialState's read of a state kept in agora_state.
const MaxPartialState = 16 << 20

// PartialState returns the partial_state a needs_input dispatch saved,
// inline in its event or kept by reference in agora_state; nil when it
// saved none. It returns an error for a dispatch that did not ask.
func (c *Client) PartialState(ctx context.Context, dispatchID string) (json.RawMessage, error) {
	d, err := c.Terminal(ctx, dispatchID)
	if err != nil {
		return nil, err
	}
	ni, ok := d.(*lifecycle.NeedsInput)
	if !ok {
		return nil, fmt.Errorf("client: dispatch %s did not ask a question", dispatchID)
	}
	if ni.PartialStateRef == "" {
		return ni.PartialState, nil
	}
	obs, err := c.js.ObjectStore(ctx, lifecycle.BucketState)
	if err != nil {
		return nil, fmt.Errorf("client: object store %s: %w", lifecycle.BucketState, err)
	}
	r, err := obs.Get(ctx, ni.PartialStateRef)
	if err != nil {
		return nil, fmt.Errorf("client: partial state %s: %w", ni.PartialStateRef, err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, MaxPartialState))
	if err != nil {
		return nil, fmt.Errorf("client: partial state %s: %w", ni.PartialStateRef, err)
	}
	return b, nil
}

// LatestProgress returns the latest progress report of a thread's runs
// (the highest stream sequence kept in AGORA_PROGRESS), or nil when none
// reported any.
func (c *Client) LatestProgress(ctx context.Context, threadID string) (*lifecycle.Progress, error) {
	it, err := c.LatestProgressItem(ctx, threadID)
	if err != nil || it == nil {
		return nil, err
	}
	return it.Progress, nil
}

// LatestProgressItem is LatestProgress with the report's event and
// sequence. It reads what is kept and returns at once.
func (c *Client) LatestProgressItem(ctx context.Context, threadID string) (*ProgressItem, error) {
	if err := lifecycle.ValidToken(threadID); err != nil {
		return nil, fmt.Errorf("client: thread id: %w", err)
	}
	cons, err := c.js.OrderedConsumer(ctx, lifecycle.StreamProgress, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{lifecycle.ProgressFilter(threadID, "")}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("client: progress of %s: %w", threadID, err)
	}
	var latest *ProgressItem
	for {
		batch, err := cons.FetchNoWait(64)
		if err != nil {
			return nil, fmt.Errorf("client: progress of %s: %w", threadID, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil || (latest != nil && md.Sequence.Stream < latest.Seq) {
				continue
			}
			e, err := lifecycle.DecodeMsg(m)
			if err != nil {
				continue
			}
			if p, err := lifecycle.Parse(e); err == nil {
				if pr, ok := p.(*lifecycle.Progress); ok {
					latest = &ProgressItem{Seq: md.Sequence.Stream, Event: e, Progress: pr}
				}
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("client: progress of %s: %w", threadID, err)
		}
		if n == 0 {
			return latest, nil
		}
	}
}

// Decline refuses to answer a question, so the router sends it to its
// route's fallback, recording who declined and why (the inbox's "decline"
// action, an answerer's Decline). Its reply and errors are Answer's; on a
// route without a fallback the question stays where it is, and the
// reply's Reason says so.
func (c *Client) Decline(ctx context.Context, questionID, by, reason string, opts ...AnswerOption) (*AnswerReply, error) {
	if err := lifecycle.ValidToken(questionID); err != nil {
		return nil, fmt.Errorf("client: question id: %w", err)
	}
	var o answerOptions
	for _, f := range opts {
		f(&o)
	}
	subject := lifecycle.APIAnswer
	if o.route != "" {
		s, err := lifecycle.APIAnswerRoute(o.route)
		if err != nil {
			return nil, fmt.Errorf("client: answer route: %w", err)
		}
		subject = s
	}
	body := struct {
		QuestionID string `json:"question_id"`
		Route      string `json:"route,omitempty"`
		AnsweredBy string `json:"answered_by"`
		Decline    bool   `json:"decline"`
		Reason     string `json:"reason"`
	}{questionID, o.route, by, true, reason}
	var reply AnswerReply
	if err := c.call(ctx, subject, nil, body, &reply); err != nil {
		return nil, err
	}
	if reply.Status == AnswerAccepted {
		return &reply, nil
	}
	return nil, &AnswerError{QuestionID: questionID, Reply: reply}
}
