package a2aserver

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// plan is a checked message that starts a task: the sub-agent and its
// input. The interceptor makes it; the executor dispatches it.
type plan struct {
	subagent string
	input    []byte
}

// resume is an answered message on a task: the executor follows the
// thread from round after on.
type resume struct {
	after int
}

type (
	planKey   struct{}
	resumeKey struct{}
)

// plan checks a message that starts a task: its skill names a sub-agent
// the caller may dispatch, and its parts make an input.
func (s *Service) plan(ctx context.Context, who *principal.Principal, m *a2a.SendMessageRequest) (plan, error) {
	name, err := s.skillOf(ctx, m)
	if err != nil {
		return plan{}, err
	}
	if !who.MayDispatch(name) {
		return plan{}, a2a.NewError(a2a.ErrUnauthorized, fmt.Sprintf("principal %s may not start skill %q: its dispatch scope in AGORA_PRINCIPALS_FILE is %v", who.Name, name, who.Dispatch))
	}
	input, err := inputOf(m.Message.Parts)
	if err != nil {
		return plan{}, err
	}
	return plan{subagent: name, input: input}, nil
}

// skillOf is the sub-agent a message picks: metadata.skill of the message,
// else of the request, else the sub-agent whose endpoint it was sent to;
// without any, the only sub-agent there is.
func (s *Service) skillOf(ctx context.Context, m *a2a.SendMessageRequest) (string, error) {
	raw, ok := m.Message.Metadata[metaSkill]
	if !ok {
		raw, ok = m.Metadata[metaSkill]
	}
	name, isString := raw.(string)
	if ok && !isString {
		return "", invalid("metadata.skill must be a string: a skill id of the agent card")
	}
	if at, _ := ctx.Value(skillKey{}).(string); at != "" {
		if name != "" && name != at {
			return "", invalid("metadata.skill %q, sent to the endpoint of skill %q: leave it out, or send it to %s", name, at, Path)
		}
		name = at
	}
	subs, err := s.c.Subagents(ctx)
	var ue *client.UndecodableError
	if err != nil && !errors.As(err, &ue) {
		return "", unavailable(err)
	}
	var names []string
	for _, sa := range subs {
		names = append(names, sa.Name)
	}
	switch {
	case name == "" && len(names) == 1:
		return names[0], nil
	case name == "":
		return "", invalid("metadata.skill is required: one of the agent card's skill ids (%s)", strings.Join(names, ", "))
	case !slices.Contains(names, name):
		return "", invalid("no skill %q: the agent card lists the skills (%s)", name, strings.Join(names, ", "))
	}
	return name, nil
}

// answer checks a message on task msg.TaskID and submits it through the
// router as the answer to the question the thread waits on, recorded as
// answered by "a2a:<principal>". A refused answer is the caller's error
// and changes nothing.
func (s *Service) answer(ctx context.Context, who *principal.Principal, msg *a2a.Message) (resume, error) {
	th, err := s.thread(ctx, who, string(msg.TaskID))
	if err != nil {
		return resume{}, err
	}
	if msg.ContextID != "" && msg.ContextID != contextOf(th) {
		return resume{}, invalid("contextId %q is not task %s's context", msg.ContextID, msg.TaskID)
	}
	last := th.Latest()
	if last.Status != lifecycle.KindNeedsInput || last.Result == nil || last.Result.QuestionID == "" {
		return resume{}, invalid("task %s is not waiting for input (its thread is %s): send a new message without taskId to start another", msg.TaskID, last.Status)
	}
	q, err := s.waitedOn(ctx, last.Result.QuestionID)
	if err != nil {
		return resume{}, err
	}
	switch {
	case q.QuestionID == "":
		return resume{}, a2a.NewError(a2a.ErrInternalError, "the question is not recorded yet: send the answer again shortly")
	case q.Status != "asked":
		return resume{}, invalid("question %s is %s (answered by %s): the task goes on without this answer", q.QuestionID, q.Status, q.AnsweredBy)
	}
	if id, ok := msg.Metadata[metaQuestionID]; ok && id != q.QuestionID && id != last.Result.QuestionID {
		return resume{}, invalid("metadata.question_id %v is not the question task %s waits on (%s)", id, msg.TaskID, q.QuestionID)
	}
	a, err := answerOf(msg.Parts, q)
	if err != nil {
		return resume{}, err
	}
	if a.ShownDigest, err = shownOf(msg); err != nil {
		return resume{}, err
	}
	via, err := s.mayAnswer(ctx, who, q)
	if err != nil {
		return resume{}, err
	}
	before, err := s.taskOf(ctx, th)
	if err != nil {
		return resume{}, err
	}
	a.AnsweredBy, a.Door = answeredBy(who), lifecycle.DoorA2A
	_, err = s.c.Answer(ctx, q.QuestionID, a, via...)
	var ae *client.AnswerError
	switch {
	case err == nil:
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerAlreadyAnswered:
		// Another answer won the race: it resumes the thread.
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerInvalid:
		return resume{}, invalid("answer refused: %s", ae.Reply.Reason)
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerChanged:
		return resume{}, invalid("answer refused, nothing was answered: %s (get the task for the question as it stands)", ae.Reply.Reason)
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerNotFound:
		return resume{}, invalid("question %s is gone", q.QuestionID)
	default:
		return resume{}, unavailable(err)
	}
	s.store.hold(before)
	return resume{after: last.Round + 1}, nil
}

// shownOf reads the shown digest an answer message echoes in its
// metadata; "" when it carries none (unbound).
func shownOf(msg *a2a.Message) (string, error) {
	v, ok := msg.Metadata[metaShownDigest]
	if !ok || v == nil {
		return "", nil
	}
	d, ok := v.(string)
	if !ok {
		return "", invalid("metadata.%s must be a string: the input-required message's", metaShownDigest)
	}
	return d, nil
}

// mayAnswer decides whether who may answer q, as every door does: its
// answer scope must hold q's route, and it must see every thread the
// answer resumes. It returns the options that make the router check the
// route again.
func (s *Service) mayAnswer(ctx context.Context, who *principal.Principal, q lifecycle.Question) ([]client.AnswerOption, error) {
	if who.Admin {
		return nil, nil
	}
	if !who.MayAnswer(q.Route) {
		return nil, a2a.NewError(a2a.ErrUnauthorized, fmt.Sprintf("principal %s may not answer question %s: it is on route %s, and its answer scope is %v (AGORA_PRINCIPALS_FILE)", who.Name, q.QuestionID, q.Route, who.Answer))
	}
	for _, w := range q.WaitingThreads {
		if _, err := s.thread(ctx, who, w.ThreadID); err != nil {
			return nil, a2a.NewError(a2a.ErrUnauthorized, fmt.Sprintf("question %s resumes threads of other principals too: principal %s may not answer it", q.QuestionID, who.Name))
		}
	}
	if who.Answer != nil {
		return []client.AnswerOption{client.AnswerVia(q.Route)}, nil
	}
	return nil, nil
}

// executor is a2a-go's AgentExecutor: it dispatches a planned task,
// follows the thread on the lifecycle stream and turns its events into
// task events, until the thread asks (input-required) or ends.
type executor struct{ s *Service }

var _ a2asrv.AgentExecutor = (*executor)(nil)

// Execute implements a2asrv.AgentExecutor.
func (e *executor) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		ctx, stop := e.s.bound(ctx)
		defer stop()
		who := principalOf(ctx)
		if who == nil {
			yield(nil, a2a.ErrUnauthenticated)
			return
		}
		after := 0
		if ec.StoredTask == nil {
			p, ok := ctx.Value(planKey{}).(plan)
			if !ok {
				yield(nil, a2a.NewError(a2a.ErrInternalError, "the message was not checked"))
				return
			}
			if err := e.s.dispatch(ctx, who, ec, p); err != nil {
				yield(nil, err)
				return
			}
			t := a2a.NewSubmittedTask(ec, ec.Message)
			t.Metadata = map[string]any{metaThreadID: string(ec.TaskID), metaRound: 0, metaSkill: p.subagent}
			if !yield(t, nil) {
				return
			}
		} else {
			r, ok := ctx.Value(resumeKey{}).(resume)
			if !ok {
				yield(nil, a2a.NewError(a2a.ErrInternalError, "the answer was not checked"))
				return
			}
			after = r.after
		}
		e.follow(ctx, ec, after, yield)
	}
}

// dispatch starts the thread of a new task: the task id is its thread
// (and root dispatch) id, the context id a label.
func (s *Service) dispatch(ctx context.Context, who *principal.Principal, ec *a2asrv.ExecutorContext, p plan) error {
	var opts []client.DispatchOption
	if s.owned() {
		opts = append(opts, client.OnBehalfOf(who.Name))
	}
	req := lifecycle.Request{DispatchID: string(ec.TaskID), Subagent: p.subagent, Input: p.input,
		Labels: map[string]string{contextLabel: ec.ContextID}}
	_, err := s.c.Dispatch(ctx, req, opts...)
	var pr *client.Problem
	var tl *client.TooLargeError
	switch {
	case err == nil:
		if err := s.index(ctx, who, ec.TaskID); err != nil {
			// The task runs; only ListTasks misses it.
			s.log.Warn("a2a: the task is not listed", "thread_id", ec.TaskID, "err", err)
		}
		return nil
	case errors.As(err, &tl):
		return invalid("%v", tl)
	case errors.As(err, &pr) && len(pr.Errors) > 0:
		var parts []string
		for _, fe := range pr.Errors {
			parts = append(parts, fe.Field+": "+fe.Message)
		}
		return invalid("refused: %s", strings.Join(parts, "; "))
	}
	return unavailable(err)
}

// follow reads the thread from its start and yields the events of rounds
// from after on: working when a round starts, input-required with the
// question when it waits on an open one, and the end.
func (e *executor) follow(ctx context.Context, ec *a2asrv.ExecutorContext, after int, yield func(a2a.Event, error) bool) {
	working := -1
	for it, err := range e.s.c.Watch(ctx, client.Filter{ThreadID: string(ec.TaskID), FromStart: true}) {
		if err != nil {
			if ctx.Err() == nil {
				e.s.log.Warn("a2a: following the thread stopped; tasks/get still reads it", "thread_id", ec.TaskID, "err", err)
			}
			return
		}
		c := it.Data.Base()
		if c.Round < after {
			continue
		}
		switch d := it.Data.(type) {
		case *lifecycle.Started:
			if c.Round > working {
				working = c.Round
				if !yield(status(ec, a2a.TaskStateWorking, c.Round, nil), nil) {
					return
				}
			}
		case *lifecycle.NeedsInput:
			q, open, err := e.s.openQuestion(ctx, d)
			if err != nil {
				e.s.log.Warn("a2a: reading a question", "thread_id", ec.TaskID, "question_id", d.QuestionID, "err", err)
				return
			}
			if open {
				yield(status(ec, a2a.TaskStateInputRequired, c.Round, questionMessage(ec, q)), nil)
				return
			}
		case *lifecycle.Finished:
			ev := &a2a.TaskArtifactUpdateEvent{TaskID: ec.TaskID, ContextID: ec.ContextID, Artifact: outputArtifact(d.DispatchID, d.Output), LastChunk: true}
			if yield(ev, nil) {
				yield(status(ec, a2a.TaskStateCompleted, c.Round, nil), nil)
			}
			return
		case *lifecycle.Failed:
			yield(status(ec, a2a.TaskStateFailed, c.Round, endMessage(ec, "end-"+d.DispatchID, failedText(d.Reason, d.Detail))), nil)
			return
		case *lifecycle.Cancelled:
			if written, ok := e.s.cancels.Load(ec.TaskID); ok {
				// This door's own cancel writes the canceled event, into
				// this execution's queue: keep it open until then.
				select {
				case <-written.(chan struct{}):
				case <-ctx.Done():
				}
				return
			}
			yield(status(ec, a2a.TaskStateCanceled, c.Round, endMessage(ec, "end-"+d.DispatchID, cancelledText(d.By, d.Reason))), nil)
			return
		}
	}
}

// status is a status update of round.
func status(ec *a2asrv.ExecutorContext, state a2a.TaskState, round int, msg *a2a.Message) *a2a.TaskStatusUpdateEvent {
	ev := a2a.NewStatusUpdateEvent(ec, state, msg)
	ev.Status.Timestamp = eventTime()
	ev.Metadata = map[string]any{metaRound: round}
	return ev
}

// Cancel implements a2asrv.AgentExecutor: it cancels the thread, as its
// owner (or an admin) may.
func (e *executor) Cancel(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		who := principalOf(ctx)
		if who == nil {
			yield(nil, a2a.ErrUnauthenticated)
			return
		}
		th, err := e.s.thread(ctx, who, string(ec.TaskID))
		if err != nil {
			yield(nil, err)
			return
		}
		if owner := th.Rounds[0].Principal; !who.MayCancel(owner) {
			yield(nil, a2a.NewError(a2a.ErrUnauthorized, fmt.Sprintf("principal %s may see task %s but not cancel it: only the principal that started it or an admin may", who.Name, ec.TaskID)))
			return
		}
		// An execution following the task sees the thread end cancelled
		// and waits for this event, which a2a-go writes into its queue.
		written := make(chan struct{})
		e.s.cancels.Store(ec.TaskID, written)
		defer func() {
			e.s.cancels.Delete(ec.TaskID)
			close(written)
		}()
		reason, _ := ec.Metadata["reason"].(string)
		by := answeredBy(who)
		res, err := e.s.c.CancelThread(ctx, th.ThreadID, client.CancelBy(by, reason))
		if err != nil {
			yield(nil, unavailable(err))
			return
		}
		if res.Outcome == client.OutcomeAlreadyEnded && (res.Status == lifecycle.KindFinished || res.Status == lifecycle.KindFailed) {
			yield(nil, a2a.NewError(a2a.ErrTaskNotCancelable, fmt.Sprintf("task %s had already ended (%s)", ec.TaskID, res.Status)))
			return
		}
		last := th.Latest()
		if l := res.Latest(); l != nil {
			last = l
		}
		yield(status(ec, a2a.TaskStateCanceled, last.Round, endMessage(ec, "end-"+last.DispatchID, cancelledText(by, reason))), nil)
	}
}

// openQuestion reads the question of a needs_input: open reports that it
// still waits for an answer (the one it joined, if it joined one). The
// router makes the record just after the event; until it exists the
// event's own fields stand for it.
func (s *Service) openQuestion(ctx context.Context, d *lifecycle.NeedsInput) (lifecycle.Question, bool, error) {
	// A thread whose cancel was asked for while it waited ends cancelled.
	if rec, err := s.c.Status(ctx, d.DispatchID); err == nil && rec.CancelRequested != nil {
		return lifecycle.Question{}, false, nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		q, err := s.waitedOn(ctx, d.QuestionID)
		if err != nil {
			return lifecycle.Question{}, false, err
		}
		if q.QuestionID != "" {
			return q, q.Status == "asked", nil
		}
		if time.Now().After(deadline) {
			return lifecycle.Question{Common: d.Common, QuestionID: d.QuestionID, Status: "asked", Question: d.Question,
				Options: d.Options, Context: d.Context, Kind: d.Kind}, true, nil
		}
		select {
		case <-ctx.Done():
			return lifecycle.Question{}, false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
