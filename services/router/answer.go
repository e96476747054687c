package router

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Limits on an answer.
const (
	MaxAnswerBytes     = 16 << 10
	MaxCommentBytes    = 4 << 10
	MaxAnsweredByBytes = 256
	MaxReasonBytes     = 1 << 10
)

// DefaultAnsweredBy names who answered with a route's default option when
// its question expired.
const DefaultAnsweredBy = "agora:default"

// Submission is the body of agora.api.answer and agora.api.answer.<route>
// and the data of dev.agora.answer.submitted on AGORA_ANSWERS: an answer,
// a decline or a suggestion (client.Submission).
type Submission = client.Submission

// The doors an answer comes through, as recorded in the history (via) and
// counted (the door label of agora_router_answers_total).
const (
	// viaAPI is agora.api.answer: trusted callers, any route.
	viaAPI = "api"
	// viaRouteAPI is agora.api.answer.<route>: that route's questions only.
	viaRouteAPI = "api-route"
	// viaStream is agora.answers.<route>.<question_id>: that route's
	// questions only.
	viaStream   = "stream"
	viaDeadline = "deadline"
)

// door is where a submission came in. NATS tells the router nothing of the
// sender but the subject, and subject permissions are what decide who may
// send there, so route is taken from the subject, never from the body: a
// door with a route accepts only questions on that route now.
type door struct {
	via     string // viaAPI, viaRouteAPI or viaStream
	subject string // the subject it came through
	route   string // the route the subject is scoped to; "" answers any route
}

// refuse says why sub, sent through d, may not touch r, or "".
func (d door) refuse(r *record, sub *Submission) string {
	switch {
	case d.route == "":
		return ""
	case sub.Route != "" && sub.Route != d.route:
		return fmt.Sprintf("the answer names route %s but came through %s, the door of route %s", clip.String(sub.Route, 64), d.subject, d.route)
	case r.Route != d.route:
		return fmt.Sprintf("question %s is on route %s, not %s", r.QuestionID, r.Route, d.route)
	}
	return ""
}

// submit handles one answer or decline that came through d and returns
// the reply for its sender, in the span agora.question.answer
// (docs/tracing.md).
func (s *Service) submit(ctx context.Context, sub Submission, d door) client.AnswerReply {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ctx, span := s.answerSpan(ctx, sub, d)
	rep := s.submitAnswer(ctx, sub, d)
	endAnswer(span, rep)
	return rep
}

// submitAnswer handles one answer or decline: it decides the attempt in
// one compare-and-set of the question's record (answering.decide), follows
// a joined question to the one it joined, then publishes what changed.
// Every attempt lands in the question's history with its door.
func (s *Service) submitAnswer(ctx context.Context, sub Submission, d door) client.AnswerReply {
	qid := sub.QuestionID
	if err := lifecycle.ValidToken(qid); err != nil {
		return s.reply(d.via, client.AnswerReply{Status: client.AnswerInvalid, Reason: "question_id: " + err.Error()})
	}
	if reason := validDoor(sub.Door); reason != "" {
		return s.reply(d.via, client.AnswerReply{Status: client.AnswerInvalid, Reason: reason})
	}
	log := s.log.With("question_id", qid, "via", d.via, "answered_by", sub.AnsweredBy)
	if d.route != "" {
		log = log.With("door_route", d.route)
	}
	mu := s.mutex(qid)
	mu.Lock()
	defer mu.Unlock()

	// The paused dispatch's record, which may carry a cancel mark, is read
	// beside the question's: its id is in the question id. A mark written
	// after this read is caught by the dispatcher, which cancels a
	// re-dispatch of a cancelled thread on acceptance (docs/wire.md,
	// "Questions and answers").
	an := &answering{s: s, sub: sub, d: d, marked: s.prefetchDispatch(ctx, qid)}
	r, rev, changed, err := s.store.updateFrom(ctx, qid, nil, 0, traced(telemetry.Or(ctx, ""), func(r *record) (bool, error) {
		return an.decide(ctx, r)
	}))
	if an.joinedTo != "" && an.joinedTo != qid {
		// Answer the question it joined. Its lock may be this one's
		// stripe: release it first (the deferred Lock runs before the
		// deferred Unlock above).
		mu.Unlock()
		defer mu.Lock()
		next := an.sub
		next.QuestionID = an.joinedTo
		return s.submitAnswer(ctx, next, d)
	}
	switch {
	case errors.Is(err, errNoQuestion):
		return s.reply(d.via, s.unknown(ctx, qid))
	case err != nil:
		log.Warn("answer not handled: temporary failure", "err", err)
		return s.reply(d.via, client.AnswerReply{Status: client.AnswerRetry, Reason: "a temporary failure; send the answer again"})
	}
	if changed {
		s.publishAnswered(ctx, log, r, rev, an.outcome)
	}
	logAnswer(log, r, an)
	return s.reply(d.via, an.reply)
}

// answering is one answer's way through the compare-and-set that decides
// it. decide runs again on each try; what it found of a cancel stays
// across tries, its reply, outcome and joinedTo are the last try's.
type answering struct {
	s      *Service
	sub    Submission
	d      door
	marked func(dispatchID string) *dispatchRecord

	cancelSeen bool
	cancelReq  lifecycle.CancelRequest
	cancelled  bool

	reply    client.AnswerReply
	outcome  lifecycle.QuestionEvent
	joinedTo string
}

// decide is the compare-and-set's step: the checks in the order they
// apply, each either settling the attempt (recorded in r's history) or
// passing it to the next, then the answer taken. It reports whether r
// changed.
func (an *answering) decide(ctx context.Context, r *record) (bool, error) {
	now := time.Now().UTC()
	a := an.attempt(now)
	an.outcome, an.joinedTo = "", ""
	if r.Status == lifecycle.StatusJoined && r.JoinedTo != "" {
		// Answered through the question it joined (docs/router.md, "Ask
		// once"). A door that follows this thread showed this question:
		// a bound answer is checked against it here, and goes on
		// unbound, since the question it joined shows another thread's
		// partial state (docs/answering.md, "Bound answers").
		if reason := staleShown(r, &an.sub); reason != "" {
			an.refuse(r, a, changedReply(reason))
			return true, nil
		}
		an.sub.ShownDigest = ""
		an.joinedTo = r.JoinedTo
		return false, nil
	}
	if an.refusedByDoor(r, &a) {
		return true, nil
	}
	if err := an.cancelIfMarked(ctx, r); err != nil {
		return false, err
	}
	if r.Status != statusAsked {
		an.refuse(r, a, closedReply(r))
		return true, nil
	}
	if an.sub.Decline {
		ev, err := an.s.decline(r, an.sub, a, &an.reply)
		an.outcome = ev
		return true, err
	}
	if reason := staleShown(r, &an.sub); reason != "" {
		an.refuse(r, a, changedReply(reason))
		return true, nil
	}
	if reason := validate(r, &an.sub); reason != "" {
		an.refuse(r, a, client.AnswerReply{Status: client.AnswerInvalid, Reason: reason})
		return true, nil
	}
	if an.sub.Suggest {
		ev, answered, err := an.s.suggest(r, &an.sub, a, &an.reply)
		if err != nil || !answered {
			an.outcome = ev
			return true, err
		}
	} else {
		an.s.countSuggestionAnswered(r, &an.sub)
	}
	return true, an.accept(r, a, now)
}

// MaxDoorBytes is the longest door name an answer may carry.
const MaxDoorBytes = 32

// validDoor says why an answer's door name is refused, or "": empty (not
// named) or 1 to MaxDoorBytes of [a-z0-9-] (lifecycle.DoorInbox, ...).
func validDoor(name string) string {
	if name == "" {
		return ""
	}
	if len(name) > MaxDoorBytes {
		return fmt.Sprintf("door is %d bytes; the limit is %d", len(name), MaxDoorBytes)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return fmt.Sprintf("door %q: want a short name of a-z, 0-9 and -, such as inbox, link, slack, mcp, a2a or cli", clip.String(name, MaxDoorBytes))
		}
	}
	return ""
}

// attempt is the history entry of the submission as it came.
func (an *answering) attempt(now time.Time) attempt {
	sub := &an.sub
	return attempt{At: now, Via: an.d.via, Door: an.d.subject, NamedDoor: sub.Door, Route: clip.String(sub.Route, 64), AnsweredBy: clip.String(sub.AnsweredBy, MaxAnsweredByBytes),
		Answer: clip.String(sub.Answer, 256), Decision: clip.String(sub.Decision, 32), ShownDigest: clip.String(sub.ShownDigest, 80)}
}

// refuse records a's refusal with rep as the reply.
func (an *answering) refuse(r *record, a attempt, rep client.AnswerReply) {
	an.reply = rep
	a.Result, a.Status, a.Reason = "refused", string(rep.Status), rep.Reason
	if an.sub.Decline {
		a.Result = "decline-refused"
	}
	r.addHistory(a)
}

// refusedByDoor refuses an answer through a route's door to a question not
// on that route, and otherwise scopes the submission to the door's route.
// It comes first: a route's answerer learns nothing of another route's
// question, not even that it was answered.
func (an *answering) refusedByDoor(r *record, a *attempt) bool {
	if an.d.route == "" {
		return false
	}
	a.Route = an.d.route
	if reason := an.d.refuse(r, &an.sub); reason != "" {
		an.refuse(r, *a, client.AnswerReply{Status: client.AnswerInvalid, Reason: reason})
		return true
	}
	an.sub.Route = an.d.route
	return false
}

// cancelIfMarked ends an asked question whose thread was cancelled (the
// mark read once per submission), so the answer finds it closed.
func (an *answering) cancelIfMarked(ctx context.Context, r *record) error {
	if r.Status != statusAsked || r.Left {
		return nil
	}
	if !an.cancelSeen {
		an.cancelReq, an.cancelled = an.s.cancelRequested(ctx, r, an.marked(r.DispatchID))
		an.cancelSeen = true
	}
	if !an.cancelled {
		return nil
	}
	ev, err := an.s.cancelThread(r, an.cancelReq, "answer")
	if err != nil {
		return err
	}
	an.outcome = ev
	return nil
}

// countSuggestionAnswered counts a person's answer to a question whose
// suggestion was below the route's auto_accept: confirmed or overridden.
func (s *Service) countSuggestionAnswered(r *record, sub *Submission) {
	sg := r.Suggestion
	if sg == nil || sg.Accepted {
		return
	}
	result := "overridden"
	if sg.Answer == sub.Answer && sg.Decision == sub.Decision {
		result = "confirmed"
	}
	s.metrics.suggestions.WithLabelValues(r.Origin, result).Inc()
}

// accept takes the valid answer: the record answered (bound to the digest
// the answer carried), the thread resumed, the ask-once follow-up owed.
func (an *answering) accept(r *record, a attempt, now time.Time) error {
	sub := &an.sub
	a.AnsweredBy, a.Answer, a.Decision = sub.AnsweredBy, clip.String(sub.Answer, 256), sub.Decision
	a.Result, a.Status = "accepted", string(client.AnswerAccepted)
	r.Answer, r.Decision, r.AnsweredBy, r.Comment = sub.Answer, sub.Decision, sub.AnsweredBy, sub.Comment
	r.BoundDigest = sub.ShownDigest
	r.AnsweredAt = &now
	r.Status = statusAnswered
	r.addHistory(a)
	if !r.Left {
		if err := an.s.resume(r, fmt.Sprintf("answered by %s", sub.AnsweredBy)); err != nil {
			return err
		}
	}
	if err := r.queueQuestion(lifecycle.QuestionAnswered, ""); err != nil {
		return err
	}
	rt, _ := an.s.routes.Load().Route(r.Origin)
	an.s.settled(r, r.MatchKey != "" && remembers(rt, r.Kind))
	an.outcome = lifecycle.QuestionAnswered
	an.reply = acceptedReply(r)
	return nil
}

// acceptedReply is the reply to the answer that answered r.
func acceptedReply(r *record) client.AnswerReply {
	reply := client.AnswerReply{Status: client.AnswerAccepted, AnsweredBy: r.AnsweredBy, AnsweredAt: r.AnsweredAt}
	switch {
	case len(r.Fanout) > 0 && r.Left:
		reply.Reason = fmt.Sprintf("the answer resumes the %d threads that asked the same question (the asking thread was cancelled)", len(r.Fanout))
	case len(r.Fanout) > 0:
		reply.Reason = fmt.Sprintf("the answer resumes the %d threads that asked the same question", len(r.Fanout)+1)
	case r.Outcome != outcomeRedispatched:
		reply.Reason = "the thread ends " + r.Outcome + ": the answer is not re-dispatched"
	}
	return reply
}

// publishAnswered counts and publishes what an answer changed in r and
// starts what ask once still owes.
func (s *Service) publishAnswered(ctx context.Context, log *slog.Logger, r *record, rev uint64, outcome lifecycle.QuestionEvent) {
	s.afterChange(ctx, r, outcome)
	if err := s.flushAt(ctx, r, rev); err != nil {
		log.Warn("publish question events: left for the scanner", "err", err)
	}
	if r.owes() {
		// The joined threads, the match, the memory: after the reply,
		// so one answer's wait does not grow with the threads it
		// resumes; the scanner finishes what a crash interrupts.
		s.goFollowUp(r.QuestionID)
	}
}

// logAnswer logs how an answer or decline went.
func logAnswer(log *slog.Logger, r *record, an *answering) {
	reply := an.reply
	switch {
	case reply.Status == client.AnswerAccepted && an.sub.Decline:
		log.Info("decline handled", "route", r.Route, "outcome", an.outcome, "reason", reply.Reason)
	case reply.Status == client.AnswerAccepted:
		log.Info("answer accepted", "route", r.Route, "outcome", an.outcome, "decline", an.sub.Decline, "next_dispatch_id", r.NextDispatchID, "bound", r.BoundDigest != "")
	default:
		log.Info("answer refused", "route", r.Route, "status", reply.Status, "reason", reply.Reason)
	}
}

// prefetchDispatch starts reading the record of the dispatch that asked
// question qid. The function it returns waits for that record when asked
// for the dispatch it read, and gives nil (read it again) otherwise or
// when the read failed.
func (s *Service) prefetchDispatch(ctx context.Context, qid string) func(dispatchID string) *dispatchRecord {
	id, ok := strings.CutPrefix(qid, lifecycle.QuestionID(""))
	if !ok || lifecycle.ValidToken(id) != nil {
		return func(string) *dispatchRecord { return nil }
	}
	ch := make(chan *dispatchRecord, 1)
	go func() {
		d, err := s.dispatchRecord(ctx, id)
		if err != nil {
			d = nil
		}
		ch <- d
	}()
	var (
		once sync.Once
		got  *dispatchRecord
	)
	return func(dispatchID string) *dispatchRecord {
		if dispatchID != id {
			return nil
		}
		once.Do(func() { got = <-ch })
		return got
	}
}

func (s *Service) reply(via string, r client.AnswerReply) client.AnswerReply {
	s.metrics.answers.WithLabelValues(via, string(r.Status)).Inc()
	return r
}

// afterChange counts a question transition once, by the router whose
// compare-and-set made it.
func (s *Service) afterChange(_ context.Context, r *record, ev lifecycle.QuestionEvent) {
	if ev == "" {
		return
	}
	s.metrics.question(r.Route, ev)
	if (ev == lifecycle.QuestionAnswered || ev == lifecycle.QuestionExpired) && r.AnsweredAt != nil {
		s.metrics.timeToAnswer.WithLabelValues(r.Origin).Observe(r.AnsweredAt.Sub(r.AskedAt).Seconds())
	}
	if r.Outcome == outcomeMaxRounds {
		s.metrics.questions.WithLabelValues(r.Route, "max_rounds").Inc()
	}
}

// closedReply is the refusal of an answer to a question that is no longer
// asked.
func closedReply(r *record) client.AnswerReply {
	rep := client.AnswerReply{Status: client.AnswerAlreadyAnswered, AnsweredBy: r.AnsweredBy, AnsweredAt: r.AnsweredAt}
	switch r.Status {
	case statusAnswered:
		rep.Reason = fmt.Sprintf("already answered by %s at %s", r.AnsweredBy, r.AnsweredAt.Format(time.RFC3339))
	case statusExpired:
		rep.Reason = "the question expired: " + r.Detail
	case statusWithdrawn:
		rep.Reason = "the question was withdrawn: " + r.Detail
	default:
		rep.Reason = "the question is " + r.Status
	}
	return rep
}

// validate checks an answer against its question and normalises it; it
// returns why the answer is refused, or "". Which kinds take free text
// beside their options: docs/inbox.md, "Answering".
func validate(r *record, sub *Submission) string {
	normalise(sub)
	for _, check := range []func(*record, *Submission) string{withinLimits, approvalDecided, answerGiven, amongOptions} {
		if reason := check(r, sub); reason != "" {
			return reason
		}
	}
	if sub.AnsweredBy == "" {
		sub.AnsweredBy = "anonymous"
	}
	return ""
}

// normalise trims the answer, decision and answerer and lowercases the
// decision.
func normalise(sub *Submission) {
	sub.Answer = strings.TrimSpace(sub.Answer)
	sub.Decision = strings.ToLower(strings.TrimSpace(sub.Decision))
	sub.AnsweredBy = strings.TrimSpace(sub.AnsweredBy)
}

// withinLimits refuses an answer too long, not UTF-8, or with a decision
// other than approve or reject.
func withinLimits(_ *record, sub *Submission) string {
	switch {
	case len(sub.Answer) > MaxAnswerBytes:
		return fmt.Sprintf("answer is %d bytes; the limit is %d", len(sub.Answer), MaxAnswerBytes)
	case len(sub.Comment) > MaxCommentBytes:
		return fmt.Sprintf("comment is %d bytes; the limit is %d", len(sub.Comment), MaxCommentBytes)
	case len(sub.AnsweredBy) > MaxAnsweredByBytes:
		return fmt.Sprintf("answered_by is %d bytes; the limit is %d", len(sub.AnsweredBy), MaxAnsweredByBytes)
	case !utf8.ValidString(sub.Answer) || !utf8.ValidString(sub.Comment) || !utf8.ValidString(sub.AnsweredBy):
		return "answer, comment and answered_by must be UTF-8 text"
	case sub.Decision != "" && sub.Decision != "approve" && sub.Decision != "reject":
		return fmt.Sprintf("decision %q: want approve or reject", clip.String(sub.Decision, 32))
	}
	return ""
}

// approvalDecided refuses an approval without a decision; the decision is
// its answer when it has none.
func approvalDecided(r *record, sub *Submission) string {
	if r.Kind != lifecycle.QuestionApproval {
		return ""
	}
	if sub.Decision == "" {
		return "an approval question needs a decision: approve or reject"
	}
	if sub.Answer == "" {
		sub.Answer = sub.Decision
	}
	return ""
}

// answerGiven refuses an empty answer, saying what the question takes
// when it came with a decision only.
func answerGiven(r *record, sub *Submission) string {
	switch {
	case sub.Answer != "":
		return ""
	case sub.Decision == "":
		return "the answer is empty"
	}
	// A decision on a question that is not an approval.
	kind := cmp.Or(r.Kind, "free-text")
	if len(r.Options) > 0 {
		return fmt.Sprintf("a decision (approve/reject) is only for approval questions; this is a %s question: answer with one of the options: %s", kind, strings.Join(r.Options, ", "))
	}
	return fmt.Sprintf("a decision (approve/reject) is only for approval questions; this is a %s question: answer with text", kind)
}

// amongOptions refuses an answer outside the options of a question whose
// options bind. The options of a clarification or information question
// are suggestions: a person may answer in their own words ("neither — do
// X"). A decision's options are binding (docs/inbox.md).
func amongOptions(r *record, sub *Submission) string {
	if len(r.Options) > 0 && !slices.Contains(r.Options, sub.Answer) && !freeTextAllowed(r.Kind) {
		return fmt.Sprintf("%q is not one of the options: %s", clip.String(sub.Answer, 64), strings.Join(r.Options, ", "))
	}
	return ""
}

// freeTextAllowed reports whether a question of kind may be answered
// outside its options.
func freeTextAllowed(kind lifecycle.QuestionKind) bool {
	return kind == lifecycle.QuestionClarification || kind == lifecycle.QuestionInformation
}

// decline moves a declined question to its route's fallback.
func (s *Service) decline(r *record, sub Submission, a attempt, reply *client.AnswerReply) (lifecycle.QuestionEvent, error) {
	reason := clip.String(strings.TrimSpace(sub.Reason), MaxReasonBytes)
	a.Reason, a.Answer, a.Decision = reason, "", ""
	if sub.Route != "" && sub.Route != r.Route {
		*reply = client.AnswerReply{Status: client.AnswerInvalid, Reason: fmt.Sprintf("the question is on route %s now, not %s", r.Route, sub.Route)}
		a.Result, a.Status = "decline-refused", string(reply.Status)
		r.addHistory(a)
		return "", nil
	}
	from := r.Route
	a.Route = from
	a.Result, a.Status = "declined", string(client.AnswerAccepted)
	r.addHistory(a)
	if !slices.Contains(r.Declined, from) {
		r.Declined = append(r.Declined, from)
	}
	next := s.fallback(r)
	if next == nil {
		*reply = client.AnswerReply{Status: client.AnswerAccepted, Reason: fmt.Sprintf("declined; route %s has no fallback that has not declined, so the question waits on it", from)}
		return "", nil
	}
	detail := "declined by " + from
	if sub.AnsweredBy != "" {
		detail = fmt.Sprintf("declined on route %s by %s", from, clip.String(sub.AnsweredBy, MaxAnsweredByBytes))
	}
	if reason != "" {
		detail += ": " + reason
	}
	if err := r.moveTo(next, detail); err != nil {
		return "", err
	}
	*reply = client.AnswerReply{Status: client.AnswerAccepted, Reason: "declined; the question went to the fallback route " + next.Name}
	return lifecycle.QuestionEscalated, nil
}

// suggest records sub, a valid answer sent as a suggestion. At or above
// the route's auto_accept it is the answer (answered_by
// suggested:<answerer>; answered true, and the caller goes on as for an
// answer); below, the question moves to the route's fallback with it,
// shown preselected, or stays when there is none (docs/answering.md,
// "Suggested answers").
func (s *Service) suggest(r *record, sub *Submission, a attempt, reply *client.AnswerReply) (ev lifecycle.QuestionEvent, answered bool, err error) {
	conf := sub.Confidence
	if conf == nil || math.IsNaN(*conf) || *conf < 0 || *conf > 1 {
		*reply = client.AnswerReply{Status: client.AnswerInvalid, Reason: "a suggestion needs a confidence from 0 to 1"}
		a.Result, a.Status, a.Reason = "refused", string(reply.Status), reply.Reason
		r.addHistory(a)
		return "", false, nil
	}
	by := clip.String(sub.AnsweredBy, MaxAnsweredByBytes-len(suggestedAnsweredBy))
	sg := &lifecycle.Suggestion{Answer: sub.Answer, Decision: sub.Decision, Confidence: *conf,
		Rationale: clip.String(strings.TrimSpace(sub.Reason), MaxReasonBytes), By: by, At: a.At}
	r.Suggestion = sg
	rt, ok := s.routes.Load().Route(r.Route)
	if ok && rt.AutoAccept > 0 && *conf >= rt.AutoAccept {
		sg.Accepted = true
		sub.AnsweredBy = suggestedAnsweredBy + by
		s.metrics.suggestions.WithLabelValues(r.Origin, "accepted").Inc()
		return "", true, nil
	}
	s.metrics.suggestions.WithLabelValues(r.Origin, "below").Inc()
	threshold := "the route takes no suggestion as an answer (no auto_accept)"
	if ok && rt.AutoAccept > 0 {
		threshold = fmt.Sprintf("below the route's auto_accept %g", rt.AutoAccept)
	}
	a.AnsweredBy, a.Answer, a.Decision = by, clip.String(sub.Answer, 256), sub.Decision
	a.Result, a.Status, a.Reason = "suggested", string(client.AnswerAccepted), fmt.Sprintf("confidence %g, %s", *conf, threshold)
	r.addHistory(a)
	from := r.Route
	if !slices.Contains(r.Declined, from) {
		r.Declined = append(r.Declined, from)
	}
	next := s.fallback(r)
	if next == nil {
		*reply = client.AnswerReply{Status: client.AnswerAccepted, Reason: fmt.Sprintf("suggestion recorded, %s; route %s has no fallback, so the question waits on it with the suggestion preselected", threshold, from)}
		return "", false, nil
	}
	detail := fmt.Sprintf("suggested %q by %s (confidence %g, %s)", clip.String(sg.Answer, 64), by, *conf, threshold)
	if err := r.moveTo(next, detail); err != nil {
		return "", false, err
	}
	*reply = client.AnswerReply{Status: client.AnswerAccepted, Reason: fmt.Sprintf("suggestion recorded, %s; the question went to the fallback route %s with it preselected", threshold, next.Name)}
	return lifecycle.QuestionEscalated, false, nil
}

// fallback finds where a declined question goes: the current route's
// fallback, and that route's fallback in turn when it declined already.
func (s *Service) fallback(r *record) *Route {
	routes := s.routes.Load()
	cur, ok := routes.Route(r.Route)
	if !ok {
		cur, ok = routes.Route(r.Origin)
	}
	for i := 0; ok && i < len(routes.list); i++ {
		next, found := routes.Route(cur.Fallback)
		if !found {
			return nil
		}
		if next.Name != r.Route && !slices.Contains(r.Declined, next.Name) {
			return next
		}
		cur = next
	}
	return nil
}

// moveTo sends the question to another route: question.escalated, then
// question.asked on the new route.
func (r *record) moveTo(rt *Route, detail string) error {
	r.Escalation++
	r.Route, r.Answerer = rt.Name, rt.Answerer
	if err := r.queueQuestion(lifecycle.QuestionEscalated, detail); err != nil {
		return err
	}
	return r.queueQuestion(lifecycle.QuestionAsked, detail)
}

// unknown answers for a question without a record: "retry" when its
// dispatch is still running or its needs_input is on the way, "not_found"
// otherwise.
func (s *Service) unknown(ctx context.Context, qid string) client.AnswerReply {
	notFound := client.AnswerReply{Status: client.AnswerNotFound, Reason: "no question " + qid}
	did, ok := strings.CutPrefix(qid, "q-")
	if !ok || lifecycle.ValidToken(did) != nil {
		return notFound
	}
	soon := client.AnswerReply{Status: client.AnswerRetry, Reason: fmt.Sprintf("the question of dispatch %s is not recorded yet; send the answer again shortly", did)}
	drec, err := s.dispatchRecord(ctx, did)
	if err == nil {
		err = s.dispatchStatus(ctx, drec)
	}
	switch {
	case err == nil:
		if !drec.Terminal() || drec.Status == lifecycle.KindNeedsInput {
			return soon
		}
		notFound.Reason = fmt.Sprintf("no question %s: dispatch %s ended %s without asking one", qid, did, drec.Status)
		return notFound
	case !errors.Is(err, errNoRecord):
		return client.AnswerReply{Status: client.AnswerRetry, Reason: "a temporary failure; send the answer again"}
	}
	// No dispatch record: a needs_input event published without the
	// dispatcher may still be waiting for the router. Read from the
	// stream leader (the older JetStream API's STREAM.MSG.GET, not a
	// direct get): a lagging replica's "none" would be answered as final
	// (docs/wire.md, "Reads by direct get").
	ljs, err := s.js.Conn().JetStream()
	if err == nil {
		_, err = ljs.GetLastMsg(lifecycle.StreamLifecycle, lifecycle.LifecycleFilter(lifecycle.KindNeedsInput, "", did), nats.Context(ctx))
	}
	switch {
	case err == nil:
		return soon
	case errors.Is(err, nats.ErrMsgNotFound):
		return notFound
	}
	return client.AnswerReply{Status: client.AnswerRetry, Reason: "a temporary failure; send the answer again"}
}

// microAnswer serves agora.api.answer, which answers any route, and
// agora.api.answer.<route>, which answers only questions on that route.
func (s *Service) microAnswer(ctx context.Context, req micro.Request) {
	ctx = telemetry.Remote(ctx, req.Headers().Get(lifecycle.TraceparentExtension))
	d := door{via: viaAPI, subject: req.Subject()}
	if d.subject != lifecycle.APIAnswer {
		d.via = viaRouteAPI
		route, err := lifecycle.ParseAPIAnswerRoute(d.subject)
		if err != nil {
			// Unreachable through the endpoint's subject; refuse rather
			// than let an unscoped answer through a route door.
			s.respond(req, s.reply(d.via, client.AnswerReply{Status: client.AnswerInvalid, Reason: "not an answer endpoint: " + err.Error()}))
			return
		}
		d.route = route
	}
	var rep client.AnswerReply
	if sub, reason := decodeSubmission(req.Data()); reason != "" {
		rep = s.reply(d.via, client.AnswerReply{Status: client.AnswerInvalid, Reason: reason})
	} else {
		rep = s.submit(ctx, sub, d)
	}
	s.respond(req, rep)
}

// decodeSubmission reads an answer strictly: a misspelt field ("anwser")
// is refused, naming it, rather than read as an empty answer. The reason
// is "" when the body is a valid submission.
func decodeSubmission(data []byte) (Submission, string) {
	var sub Submission
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(&sub)
	if err == nil {
		return sub, ""
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return sub, fmt.Sprintf("unknown field %s: an answer has question_id, route, answer, decision, answered_by, comment, shown_digest, decline, reason, suggest and confidence", clip.String(name, 64))
	}
	return sub, "the body is not a JSON answer: " + err.Error()
}

func (s *Service) respond(req micro.Request, rep client.AnswerReply) {
	if err := req.RespondJSON(rep); err != nil {
		s.log.Warn("micro: respond", "err", err)
	}
}

// maxStreamRetries bounds the redeliveries of a stream answer whose
// question is not recorded yet (about 4 minutes at 2 s).
const maxStreamRetries = 120

// onAnswerMsg handles one answer from AGORA_ANSWERS.
func (s *Service) onAnswerMsg(ctx context.Context, m jetstream.Msg) verdict {
	log := s.log.With("subject", m.Subject())
	e, err := lifecycle.DecodeMsg(m)
	if err != nil {
		log.Error("undecodable answer terminated", "err", err)
		return term("undecodable")
	}
	ctx = telemetry.Remote(ctx, lifecycle.Traceparent(e))
	if e.Type() != lifecycle.TypeAnswerSubmitted {
		log.Warn("not an answer: skipped", "type", e.Type(), "id", e.ID())
		return ack
	}
	sub, reason := decodeSubmission(e.Data())
	if reason != "" {
		log.Error("answer refused and terminated", "id", e.ID(), "reason", reason)
		return term("bad data")
	}
	// The subject permissions scope agora.answers.<route>.> by route, so
	// the route is the subject's; an answer on another shape of subject
	// could not be scoped and is dropped.
	route, qid, err := lifecycle.ParseAnswerSubject(m.Subject())
	if err != nil {
		log.Error("answer on a subject that names no route and question terminated", "id", e.ID(), "err", err)
		return term("bad subject")
	}
	if sub.QuestionID == "" {
		sub.QuestionID = qid
	}
	rep := s.submit(ctx, sub, door{via: viaStream, subject: m.Subject(), route: route})
	if rep.Status == client.AnswerRetry {
		if md, err := m.Metadata(); err == nil && md.NumDelivered >= maxStreamRetries {
			log.Warn("answer dropped: its question never appeared", "question_id", sub.QuestionID, "reason", rep.Reason)
			return term("question never appeared")
		}
		return retryIn(2 * time.Second)
	}
	return ack
}
