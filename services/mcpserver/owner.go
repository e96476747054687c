package mcpserver

import (
	"context"
	"errors"
	"fmt"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Whose thread it is, over MCP as over /v1 (docs/security.md,
// "Principals and scopes"): a thread belongs to the principal that
// dispatched its first round; a principal that sees only its own threads
// reads, follows, answers and cancels those, and is told of any other
// thread what it is told of one that does not exist.

// ownerOf returns the principal whose thread threadID is (its first
// round's record); empty when it has none or there is no such thread.
func (t *tools) ownerOf(ctx context.Context, threadID string) (string, error) {
	rec, err := t.s.c.Status(ctx, threadID)
	switch {
	case errors.Is(err, client.ErrNotFound):
		return "", nil
	case err != nil:
		return "", err
	}
	return rec.Principal, nil
}

// seeThread returns nil when the caller may see thread threadID (and,
// with cancel, cancel it); otherwise the error of an unknown thread, or
// one saying it may see but not cancel it.
func (t *tools) seeThread(ctx context.Context, threadID string, cancel bool) error {
	if t.who.Admin || (t.who.SeeAll && !cancel) {
		return nil
	}
	owner, err := t.ownerOf(ctx, threadID)
	if err != nil {
		return t.explain(err)
	}
	return t.judge("thread", threadID, threadID, owner, cancel)
}

// seeDispatch is seeThread for the thread of dispatch id; an unknown
// dispatch is left to the tool, which says so. A root dispatch's record
// names its thread's owner itself.
func (t *tools) seeDispatch(ctx context.Context, id string, cancel bool) error {
	if t.who.Admin || (t.who.SeeAll && !cancel) {
		return nil
	}
	rec, err := t.s.c.Status(ctx, id)
	switch {
	case errors.Is(err, client.ErrNotFound):
		return nil
	case err != nil:
		return t.explain(err)
	}
	owner := rec.Principal
	if rec.ThreadID != id {
		if owner, err = t.ownerOf(ctx, rec.ThreadID); err != nil {
			return t.explain(err)
		}
	}
	return t.judge("dispatch", id, rec.ThreadID, owner, cancel)
}

// seeRead is seeThread for a thread already read: its first round's
// record names the owner, so nothing is read again.
func (t *tools) seeRead(th *client.Thread) error {
	if t.who.Admin || t.who.SeeAll {
		return nil
	}
	owner := ""
	for _, r := range th.Rounds {
		if r.Round == 0 {
			owner = r.Principal
		}
	}
	return t.judge("thread", th.ThreadID, th.ThreadID, owner, false)
}

// judge decides for what (a thread or a dispatch) id of thread threadID,
// whose owner is owner: nil, the error of an unknown id, or the one that
// says the caller may see it but not cancel it.
func (t *tools) judge(what, id, threadID, owner string, cancel bool) error {
	p := t.who
	if !p.MaySee(owner) {
		return t.explainTarget(client.ErrNotFound, what, id)
	}
	if cancel && !p.MayCancel(owner) {
		return fmt.Errorf("principal %s may see thread %s but not cancel it: only the principal that dispatched it (%s) or an admin may", p.Name, threadID, owner)
	}
	return nil
}

// seeQuestion returns nil when the caller may see every thread question
// q resumes when answered (its asking thread and those that joined it).
func (t *tools) seeQuestion(ctx context.Context, q *lifecycle.Question) error {
	if t.who.Admin || t.who.SeeAll {
		return nil
	}
	threads := []string{q.ThreadID}
	for _, w := range q.WaitingThreads {
		threads = append(threads, w.ThreadID)
	}
	for _, th := range threads {
		if err := t.seeThread(ctx, th, false); err != nil {
			return fmt.Errorf("no question %s: agora_questions lists them", q.QuestionID)
		}
	}
	return nil
}

// filterQuestions keeps the questions of threads the caller sees.
func (t *tools) filterQuestions(ctx context.Context, qs []lifecycle.Question) ([]lifecycle.Question, error) {
	if t.who.Admin || t.who.SeeAll {
		return qs, nil
	}
	owners := map[string]string{}
	var out []lifecycle.Question
	for _, q := range qs {
		owner, ok := owners[q.ThreadID]
		if !ok {
			var err error
			if owner, err = t.ownerOf(ctx, q.ThreadID); err != nil {
				return nil, t.explain(err)
			}
			owners[q.ThreadID] = owner
		}
		if t.who.MaySee(owner) {
			out = append(out, q)
		}
	}
	return out, nil
}

// scopeError says which scope a tool needs.
func (t *tools) scopeError(what, needs string) error {
	return fmt.Errorf("principal %s may not %s: that needs %s in AGORA_PRINCIPALS_FILE", t.who.Name, what, needs)
}
