package client

import (
	"context"
	"encoding/json"
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

// maxPartialState bounds PartialState's read of a state kept in agora_state.
const maxPartialState = 16 << 20

// PartialState returns the partial_state a needs_input dispatch saved,
// inline in its event or kept by reference in agora_state; nil when it
// saved none. It returns an error for a dispatch that did not ask. It reads
// at most 16 MiB of a state kept by reference.
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
	b, err := io.ReadAll(io.LimitReader(r, maxPartialState))
	if err != nil {
		return nil, fmt.Errorf("client: partial state %s: %w", ni.PartialStateRef, err)
	}
	return b, nil
}

// LatestProgress returns the latest progress report of a thread's runs
// (the highest stream sequence kept in AGORA_PROGRESS) with its event and
// sequence, or nil when none reported any. It reads what is kept and
// returns at once; WatchProgress follows reports as they come.
func (c *Client) LatestProgress(ctx context.Context, threadID string) (*ProgressItem, error) {
	if err := lifecycle.ValidToken(threadID); err != nil {
		return nil, fmt.Errorf("client: thread id: %w", err)
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{lifecycle.ProgressFilter(threadID, "")}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	}
	// The last report of each of the thread's dispatches, in stream order:
	// the latest is the one read last.
	var latest *ProgressItem
	err := c.readKept(ctx, lifecycle.StreamProgress, cfg, "progress of "+threadID, func(m jetstream.Msg) bool {
		if it, ok := progressItem(m); ok && (latest == nil || it.Seq > latest.Seq) {
			latest = &it
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return latest, nil
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
	subject, route, err := answerSubject(opts)
	if err != nil {
		return nil, err
	}
	body := Submission{QuestionID: questionID, Route: route, AnsweredBy: by, Decline: true, Reason: reason}
	return c.submit(ctx, subject, questionID, body)
}
