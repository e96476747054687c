package router

import (
	"context"
	"fmt"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// publishJoined publishes question.joined for r once it is seated on the
// question it joined (docs/answering.md, "Asking once"), so the decision
// log has the join when it happens, not only when that question's answer
// comes. It does nothing for a question that is not joined (asked on its
// own after all, or ended). The event's id is <question_id>.joined: the
// redelivery of a needs_input whose joined event was not acknowledged
// seats the question again and publishes a duplicate.
func (s *Service) publishJoined(ctx context.Context, r *record) error {
	if r.Status != lifecycle.StatusJoined || r.JoinedTo == "" {
		return nil
	}
	q := r.snapshot(lifecycle.QuestionJoined, "joined question "+r.JoinedTo+", asked already on route "+r.Route+", whose answer answers this thread too")
	subj, err := lifecycle.QuestionSubject(q.Route, q.QuestionID, lifecycle.QuestionJoined)
	if err != nil {
		return err
	}
	e, err := lifecycle.New(s.source, &q)
	if err != nil {
		return fmt.Errorf("router: build %s.joined: %w", q.QuestionID, err)
	}
	e.SetID(q.QuestionID + "." + string(lifecycle.QuestionJoined))
	msg, err := lifecycle.Encode(subj, e)
	if err != nil {
		return err
	}
	if _, err := s.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("router: publish %s.joined: %w", q.QuestionID, err)
	}
	return nil
}
