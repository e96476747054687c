package router

import (
	"context"
	"fmt"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/statedigest"
	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/client"
)

// Bound answers (docs/answering.md, "Bound answers"): a question carries
// the digest of what it shows a person, the doors send it back with the
// answer, and an answer whose digest is not the question's as it stands
// is refused.

// shownDigest is the digest of what r shows a person: pkg/audit's
// ShownDigest of its text, context, kind, options and the digest of its
// partial state, computed as the decision log computes it for the asked
// entry (docs/audit.md), so an answered entry's bound_digest names the
// asked entry it was given on.
func (s *Service) shownDigest(ctx context.Context, r *record) string {
	return audit.ShownDigest(r.Question.Question, r.Context, string(r.Kind), r.Options, s.partialStateDigest(ctx, r))
}

// partialStateDigest is the digest of r's partial state (statedigest.Of).
func (s *Service) partialStateDigest(ctx context.Context, r *record) string {
	return statedigest.Of(ctx, s.js, r.PartialState, r.PartialStateRef)
}

// staleShown says why sub, bound to what its door showed, may not answer
// r as it stands, or "" (unbound, or bound to what r shows).
func staleShown(r *record, sub *Submission) string {
	if sub.ShownDigest == "" || sub.ShownDigest == r.ShownDigest {
		return ""
	}
	return fmt.Sprintf("question %s no longer shows what this answer was given on (shown_digest %s; it shows %s now): it was reworded, moved or asked anew. Reload it, look at the question again, and answer what it asks now",
		r.QuestionID, clip.String(sub.ShownDigest, 80), r.ShownDigest)
}

// changedReply is the refusal of an answer bound to what r no longer shows.
func changedReply(reason string) client.AnswerReply {
	return client.AnswerReply{Status: client.AnswerChanged, Reason: reason}
}
