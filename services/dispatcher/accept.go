package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Limits on a dispatch request.
const (
	// MaxRequestBytes bounds a whole request as received
	// (lifecycle.MaxRequestBytes, which clients check before sending).
	MaxRequestBytes = lifecycle.MaxRequestBytes
	// MaxInputBytes bounds the input object (lifecycle.MaxInputBytes).
	MaxInputBytes = lifecycle.MaxInputBytes
	// MaxTargetBytes bounds the target string.
	MaxTargetBytes = 4 << 10
	// MaxEntries bounds the entries of env and of labels.
	MaxEntries = 256
	// MaxLabelBytes bounds a label key and a label value.
	MaxLabelBytes = 1 << 10
)

var (
	// Dispatch, thread and parent ids: subject tokens, KV keys and URL
	// path segments.
	idRE = regexp.MustCompile(`^[A-Za-z0-9_=-]{1,128}$`)
	// Question ids are derived from dispatch ids (q-<dispatch_id>).
	questionRE = regexp.MustCompile(`^[A-Za-z0-9_=-]{1,200}$`)
)

// decodeRequest reads a request's JSON, naming the field at fault. An
// unknown member is refused: a misspelt "inptu" would otherwise run the
// sub-agent with no input.
func decodeRequest(data []byte) (lifecycle.Request, *client.Problem) {
	var req lifecycle.Request
	if len(bytes.TrimSpace(data)) == 0 {
		return req, client.Invalid(client.FieldError{Field: "request", Message: `is empty: want a JSON object such as {"subagent": "planner", "input": {}}`})
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil {
		return req, nil
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return req, client.Invalid(client.FieldError{Field: short(name), Message: "is not a field of a dispatch request (" + requestFields + ")"})
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return req, client.Invalid(client.FieldError{Field: te.Field, Message: fmt.Sprintf("must be %s, not a JSON %s", jsonKind(te.Type), te.Value)})
	case errors.As(err, &te):
		return req, client.Invalid(client.FieldError{Field: "request", Message: fmt.Sprintf("must be a JSON object, not a JSON %s", te.Value)})
	case errors.As(err, &se):
		return req, client.Invalid(client.FieldError{Field: "request", Message: fmt.Sprintf("is not valid JSON (at byte %d): %v", se.Offset, err)})
	}
	return req, client.Invalid(client.FieldError{Field: "request", Message: err.Error()})
}

// requestFields lists a dispatch request's fields, for the error that
// refuses an unknown one.
const requestFields = "known: dispatch_id, subagent, input, target, env, labels, timeout, max_rounds, thread_id, parent_id, round, question_id, subagent_revision, partial_state_ref"

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Bool:
		return "a boolean"
	}
	return "a " + t.String()
}

// validate checks req against the contract and the registry, reporting
// every field at fault at once as a 422 *client.Problem. Any other error is
// temporary. It returns the definition and its KV revision.
func (s *Service) validate(ctx context.Context, b *bindings, req *lifecycle.Request, size int) (subagent.Definition, uint64, error) {
	var errs []client.FieldError
	add := func(field, format string, a ...any) {
		errs = append(errs, client.FieldError{Field: field, Message: fmt.Sprintf(format, a...)})
	}
	if size > MaxRequestBytes {
		add("request", "is %d bytes; the limit is %d", size, MaxRequestBytes)
	}
	switch {
	case req.Subagent == "":
		add("subagent", "is required")
	case !subagent.ValidName(req.Subagent):
		add("subagent", "%q is not a sub-agent name: 1-64 letters, digits, '-' or '_'", short(req.Subagent))
	}
	for _, f := range []struct{ name, v string }{{"dispatch_id", req.DispatchID}, {"thread_id", req.ThreadID}, {"parent_id", req.ParentID}} {
		if f.v != "" && !idRE.MatchString(f.v) {
			add(f.name, "%q is not a valid id: 1-128 letters, digits, '-', '_' or '='", short(f.v))
		}
	}
	if req.QuestionID != "" && !questionRE.MatchString(req.QuestionID) {
		add("question_id", "%q is not a valid id: 1-200 letters, digits, '-', '_' or '='", short(req.QuestionID))
	}
	switch {
	case req.Round < 0:
		add("round", "%d is negative", req.Round)
	case req.Round == 0:
		if req.ParentID != "" {
			add("parent_id", "must be empty for a root dispatch (round 0)")
		}
		if req.ThreadID != "" && req.ThreadID != req.DispatchID {
			add("thread_id", "a root dispatch (round 0) starts its own thread: leave thread_id empty or equal to dispatch_id")
		}
	default:
		if req.ThreadID == "" {
			add("thread_id", "is required when round > 0 (a re-dispatch continues a thread)")
		}
		if req.ParentID == "" {
			add("parent_id", "is required when round > 0 (the dispatch whose question was answered)")
		}
	}
	if in := bytes.TrimSpace(req.Input); len(in) > 0 && !bytes.Equal(in, []byte("null")) {
		if in[0] != '{' {
			add("input", "must be a JSON object, not %s", jsonValueKind(in))
		}
		if len(in) > MaxInputBytes {
			add("input", "is %d bytes; the limit is %d (pass large data by reference)", len(in), MaxInputBytes)
		}
	}
	if req.Timeout != "" {
		if d, err := time.ParseDuration(req.Timeout); err != nil || d <= 0 {
			add("timeout", "%q is not a positive duration such as 30m or 1h30m", short(req.Timeout))
		}
	}
	if req.MaxRounds < 0 {
		add("max_rounds", "%d is negative", req.MaxRounds)
	}
	if len(req.Env) > MaxEntries {
		add("env", "has %d entries; the limit is %d", len(req.Env), MaxEntries)
	}
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		switch {
		case !subagent.ValidEnvName(k):
			add("env", "%q is not a valid variable name (letters, digits and '_', not starting with a digit)", short(k))
		case subagent.Reserved(k):
			add("env", "%q is reserved: a sub-agent never gets AGORA_* or NATS_* variables", k)
		case strings.ContainsRune(req.Env[k], 0):
			add("env", "the value of %s contains a NUL byte", k)
		}
	}
	if len(req.Labels) > MaxEntries {
		add("labels", "has %d entries; the limit is %d", len(req.Labels), MaxEntries)
	}
	for _, k := range slices.Sorted(maps.Keys(req.Labels)) {
		switch {
		case k == "" || len(k) > MaxLabelBytes:
			add("labels", "a key must be 1 to %d bytes", MaxLabelBytes)
		case len(req.Labels[k]) > MaxLabelBytes:
			add("labels", "the value of %q is longer than %d bytes", short(k), MaxLabelBytes)
		}
	}
	if len(req.Target) > MaxTargetBytes {
		add("target", "is %d bytes; the limit is %d", len(req.Target), MaxTargetBytes)
	}
	if r := req.PartialStateRef; r != "" && (len(r) > 1024 || !utf8.ValidString(r) || strings.ContainsFunc(r, func(c rune) bool { return c < 0x20 || c == 0x7f })) {
		add("partial_state_ref", "must be a printable name of at most 1024 bytes")
	}

	var def subagent.Definition
	var rev uint64
	if subagent.ValidName(req.Subagent) {
		d, err := s.lookup(ctx, b, req.Subagent, false)
		if err == nil && d.rev > 0 && s.refuses(d.def, req) {
			// A refusal names the stored revision, not a copy that may
			// lag an apply made a moment ago.
			d, err = s.lookup(ctx, b, req.Subagent, true)
		}
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			add("subagent", "no sub-agent named %q is registered (agora subagent apply -f FILE)", req.Subagent)
		case err != nil:
			return def, 0, err
		case d.err != nil:
			add("subagent", "the registered definition of %q cannot be read: %v", req.Subagent, d.err)
		default:
			def, rev = d.def, d.rev
		}
	}
	// The request may set only the variables the definition allows.
	if rev > 0 {
		for _, k := range envRefused(def, req.Env) {
			what := "is not in"
			if subagent.Hook(k) {
				what = "is a loader or interpreter hook, and not in"
			}
			add("env", "%q %s the sub-agent's env_allow %v: a request may set only the variables its definition allows", k, what, def.EnvAllow)
		}
		if longer(def, req) {
			add("timeout", "%q is longer than the sub-agent's timeout %s: a request can only shorten it", short(req.Timeout), defTimeout(def))
		}
		// The operator's floor: a definition stored before the floor was
		// raised (or by a writer that skipped apply's check) never runs.
		var fe *subagent.FloorError
		if errors.As(def.Sandbox.CheckFloor(s.cfg.Floor()), &fe) {
			for _, p := range fe.Problems {
				add("subagent", "the registered definition of %q is below the operator's sandbox floor: %s", req.Subagent, p)
			}
		}
	}
	if len(errs) > 0 {
		return def, 0, client.Invalid(errs...)
	}
	return def, rev, nil
}

// refuses reports whether def refuses req for a reason of the definition's
// own (env, timeout, the operator's floor), which a refusal must name at
// its stored revision.
func (s *Service) refuses(def subagent.Definition, req *lifecycle.Request) bool {
	return len(envRefused(def, req.Env)) > 0 || longer(def, req) || def.Sandbox.CheckFloor(s.cfg.Floor()) != nil
}

// longer reports whether a root request asks for a longer timeout than
// its definition's: a request can only shorten it. A later round (the
// router's re-dispatch carries the paused round's timeout, which a change
// of the definition may have shortened since) is not refused but cut to
// the definition's by complete.
func longer(def subagent.Definition, req *lifecycle.Request) bool {
	d, err := time.ParseDuration(req.Timeout)
	return req.Round == 0 && err == nil && d > def.TimeoutDuration()
}

// defTimeout is the definition's timeout as a request records it: as the
// definition says it, when it is valid, else the default.
func defTimeout(def subagent.Definition) string {
	if d, err := time.ParseDuration(def.Timeout); err == nil && d > 0 {
		return def.Timeout
	}
	return def.TimeoutDuration().String()
}

// envRefused lists, sorted, the request's valid variables that def's
// env_allow does not allow.
func envRefused(def subagent.Definition, env map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if subagent.ValidEnvName(k) && !subagent.Reserved(k) && !slices.Contains(def.EnvAllow, k) {
			out = append(out, k)
		}
	}
	return out
}

func jsonValueKind(b []byte) string {
	switch b[0] {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// short shortens a value quoted in an error message.
func short(s string) string { return clip.String(s, 64) }

// complete fills what the dispatcher decides: ids, input, revision,
// timeout (the definition's when the request leaves it out or asks for
// more) and round limit.
func complete(req *lifecycle.Request, def subagent.Definition, rev uint64) {
	if req.DispatchID == "" {
		req.DispatchID = lifecycle.NewID()
	}
	if req.ThreadID == "" {
		req.ThreadID = req.DispatchID
	}
	if in := bytes.TrimSpace(req.Input); len(in) == 0 || bytes.Equal(in, []byte("null")) {
		req.Input = json.RawMessage(`{}`)
	}
	req.SubagentRevision = rev
	// A request can only shorten the definition's timeout (a root asking
	// for more was refused by validate).
	if d, err := time.ParseDuration(req.Timeout); req.Timeout == "" || err == nil && d > def.TimeoutDuration() {
		req.Timeout = defTimeout(def)
	}
	if req.MaxRounds == 0 {
		req.MaxRounds = def.Rounds()
	}
}

// accept is the one code path of every door. It returns the dispatch
// record and the result label. The same dispatch id again returns the
// first record, after finishing its acceptance if that was interrupted. A
// refused request answers a *client.Problem; any other error is temporary
// and the request may be retried as it is. door names where it came in,
// for its span (docs/tracing.md).
func (s *Service) accept(ctx context.Context, b *bindings, req lifecycle.Request, size int, traceparent, door string) (rec client.Record, result string, err error) {
	ctx, span := intakeSpan(ctx, traceparent, door, req)
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(telemetry.KeyOutcome.String(result))
			if rec.DispatchID != "" {
				span.SetAttributes(telemetry.Dispatch(rec.Common())...)
			}
		}
		// A refusal is an answer, not a failure of the span; the request's
		// own error is returned as it is, whatever the span records.
		spanErr := err
		var p *client.Problem
		if errors.As(err, &p) {
			spanErr = nil
		}
		telemetry.End(span, spanErr)
	}()
	// With tracing on, the dispatch's trace continues from this span.
	traceparent = telemetry.Or(ctx, traceparent)
	// A fresh request is validated and created at once; a repeat of an
	// accepted one is found by the create (the id is taken) or, when it
	// no longer validates, by a read: either way the first record answers.
	vctx, vspan := telemetry.Tracer().Start(ctx, "agora.dispatch.validate")
	def, rev, err := s.validate(vctx, b, &req, size)
	vspan.End()
	if err != nil {
		var p *client.Problem
		if errors.As(err, &p) && req.DispatchID != "" && idRE.MatchString(req.DispatchID) {
			first, _, rerr := b.store.get(ctx, req.DispatchID)
			switch {
			case rerr == nil:
				return s.repeat(ctx, b, first, req)
			case !errors.Is(rerr, errNoRecord):
				return client.Record{}, resultError, rerr
			}
		}
		return client.Record{}, resultOf(err), err
	}
	complete(&req, def, rev)
	if !lifecycle.ValidTraceparent(traceparent) {
		traceparent = lifecycle.NewTraceparent()
	}
	now := time.Now().UTC()
	rec = client.Record{
		DispatchID: req.DispatchID, ThreadID: req.ThreadID, ParentID: req.ParentID, Round: req.Round,
		Subagent: req.Subagent, SubagentRevision: rev, Status: lifecycle.KindAccepted,
		Traceparent: traceparent, Request: &req, CreatedAt: now, AcceptedAt: &now, UpdatedAt: now,
	}
	result = resultAccepted
	if req.Round > req.MaxRounds {
		rec.Status, rec.AcceptedAt, rec.EndedAt = lifecycle.KindFailed, nil, &now
		rec.Result = &client.Result{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonMaxRounds,
			Detail: fmt.Sprintf("round %d exceeds the thread's limit of %d rounds", req.Round, req.MaxRounds)}
		result = resultMaxRounds
	} else {
		// The record lists the accepted event it is about to publish
		// (finish sends it with this time), so the projection has
		// nothing to write for it.
		rec.Events = []client.EventRef{{ID: lifecycle.AcceptedID(rec.DispatchID), Kind: lifecycle.KindAccepted, Time: now}}
	}
	// A root's thread index is written beside the record, not after it: a
	// crash between the two leaves an entry without a record, which every
	// reader skips and a retry completes (docs/dispatcher.md). A root's
	// thread is its own id, so even a request that turns out to conflict
	// with the record under that id indexes nothing of another thread. A
	// later round is indexed after its record exists and is its own.
	// (Its index is read beside the record's write, which saves that
	// read's round trip.)
	var pre *indexRead
	indexed := make(chan error, 1)
	rctx, rspan := telemetry.Tracer().Start(ctx, "agora.dispatch.record")
	go func() {
		if req.Round == 0 {
			indexed <- b.store.index(rctx, rec.ThreadID, rec.Round, rec.DispatchID)
			return
		}
		pre = b.store.readIndex(rctx, rec.ThreadID)
		indexed <- nil
	}()
	created, err := b.store.create(rctx, &rec)
	ierr := <-indexed
	if req.Round > 0 && err == nil {
		ierr = b.store.indexFrom(rctx, rec.ThreadID, rec.Round, rec.DispatchID, pre)
	}
	if errors.Is(err, errConflict) {
		telemetry.End(rspan, ierr) // a repeat: answered below
	} else {
		telemetry.End(rspan, errors.Join(err, ierr))
	}
	if err != nil {
		if !errors.Is(err, errConflict) {
			return client.Record{}, resultError, err
		}
		// The id is taken (a retry, or another door won the race for
		// it): answer its record.
		first, _, err := b.store.get(ctx, rec.DispatchID)
		if err != nil {
			return client.Record{}, resultError, err
		}
		return s.repeat(ctx, b, first, req)
	}
	if len(rec.Events) > 0 {
		s.metrics.applied(lifecycle.KindAccepted, "") // listed by the record itself
	}
	if ierr != nil {
		return rec, result, withID(ierr, rec.DispatchID) // a retry finds the record and indexes it
	}
	rec, err = s.finish(ctx, b, rec, created)
	return rec, result, withID(err, rec.DispatchID)
}

// repeat answers a request whose dispatch id has a record: the record,
// once its acceptance is complete, or a conflict when the request differs
// from the recorded one.
func (s *Service) repeat(ctx context.Context, b *bindings, first client.Record, req lifecycle.Request) (client.Record, string, error) {
	if err := requestConflict(first.Request, req); err != nil {
		return client.Record{}, resultConflict, err
	}
	first, err := s.finish(ctx, b, first, 0)
	return first, resultDuplicate, withID(err, first.DispatchID)
}

// idError is a temporary failure after the dispatch got its id: the answer
// names the id, so a retry with it completes the same dispatch instead of
// starting a second one.
type idError struct {
	id  string
	err error
}

func (e *idError) Error() string { return e.err.Error() }
func (e *idError) Unwrap() error { return e.err }

func withID(err error, id string) error {
	if err == nil {
		return nil
	}
	return &idError{id: id, err: err}
}

func resultOf(err error) string {
	var p *client.Problem
	if errors.As(err, &p) {
		return resultRejected
	}
	return resultError
}

// finish completes an acceptance whose record exists: index the thread,
// then either publish failed max-rounds, or emit accepted, queue the
// request and mark the record queued. Every step is idempotent, so finish
// runs again safely when a retry finds a record that is not queued.
// created is the revision of a record created just now, already indexed
// (nothing was published for it before); 0 for a record found.
func (s *Service) finish(ctx context.Context, b *bindings, rec client.Record, created uint64) (client.Record, error) {
	if rec.Request == nil {
		return rec, nil // made by the projection from a refused request: nothing to queue
	}
	fresh := created > 0
	if !fresh {
		if err := b.store.index(ctx, rec.ThreadID, rec.Round, rec.DispatchID); err != nil {
			return rec, err
		}
	}
	if rec.Result != nil && rec.Result.Reason == lifecycle.ReasonMaxRounds && rec.AcceptedAt == nil {
		if !fresh {
			if ok, err := s.eventExists(ctx, b, lifecycle.KindFailed, rec); err != nil || ok {
				return rec, err
			}
		}
		d := &lifecycle.Failed{Common: rec.Common(), Reason: lifecycle.ReasonMaxRounds, Detail: rec.Result.Detail}
		_, _, err := s.emit(ctx, b, d, rec.Traceparent)
		return rec, err
	}
	if rec.Queued || rec.Terminal() {
		return rec, nil // done, or cancelled before it was queued: a worker would skip it
	}
	mark, err := s.parentCancel(ctx, b, rec)
	if err != nil {
		return rec, err
	}
	if mark != nil {
		return s.cancelOnAcceptance(ctx, b, rec, fresh, mark)
	}
	if err := s.publish(ctx, b, rec, fresh); err != nil {
		return rec, err
	}
	queued := func(r *client.Record) bool {
		if r.Queued {
			return false
		}
		r.Queued = true
		return true
	}
	mctx, mspan := telemetry.Tracer().Start(ctx, "agora.dispatch.mark")
	if fresh {
		rec, err = b.store.updateFrom(mctx, rec, created, queued)
	} else {
		rec, err = b.store.update(mctx, rec.DispatchID, queued)
	}
	telemetry.End(mspan, err)
	return rec, err
}

// acceptedPending reports whether the accepted event of rec is still to
// be published: always for a record created just now, otherwise when the
// stream has none.
func (s *Service) acceptedPending(ctx context.Context, b *bindings, rec client.Record, fresh bool) (bool, error) {
	if fresh {
		return true, nil
	}
	ok, err := s.eventExists(ctx, b, lifecycle.KindAccepted, rec)
	return !ok, err
}

// publish sends the accepted event and the queued work of rec, the
// accepted event first on the same connection so the server stores it
// first; both acknowledgements are awaited together, which saves a round
// trip before a worker can start (docs/dispatcher.md). Its span,
// agora.dispatch.publish, times the two; the events name the dispatch's
// span (ctx's) as their cause.
func (s *Service) publish(ctx context.Context, b *bindings, rec client.Record, fresh bool) (err error) {
	_, span := telemetry.Tracer().Start(ctx, "agora.dispatch.publish", trace.WithSpanKind(trace.SpanKindProducer))
	defer func() { telemetry.End(span, err) }()
	req := *rec.Request
	pending, err := s.acceptedPending(ctx, b, rec, fresh)
	if err != nil {
		return err
	}
	var accepted jetstream.PubAckFuture
	if pending {
		d := &lifecycle.Accepted{Common: rec.Common(), SubagentRevision: rec.SubagentRevision, Target: req.Target, Labels: req.Labels}
		_, msg, err := lifecycle.Message(s.source, d, telemetry.Event(ctx, rec.Traceparent), acceptedTime(rec))
		if err != nil {
			return fmt.Errorf("dispatcher: build event: %w", err)
		}
		if accepted, err = b.js.PublishMsgAsync(msg, jetstream.WithExpectStream(lifecycle.StreamLifecycle)); err != nil {
			return fmt.Errorf("dispatcher: publish accepted %s: %w", rec.DispatchID, err)
		}
	}
	// A record a worker already started was queued: only the flag is missing.
	if fresh || rec.Status == lifecycle.KindAccepted {
		if err := s.queue(ctx, b, &req, rec.Traceparent); err != nil {
			return err
		}
	}
	if accepted != nil {
		select {
		case <-accepted.Ok():
		case err := <-accepted.Err():
			return fmt.Errorf("dispatcher: publish accepted %s: %w", rec.DispatchID, err)
		case <-ctx.Done():
			return fmt.Errorf("dispatcher: publish accepted %s: %w", rec.DispatchID, ctx.Err())
		}
	}
	return nil
}

// cancelOnAcceptance ends a re-dispatch whose thread was cancelled while
// paused on the question this round answers: accepted (once), then
// cancelled, never queued.
func (s *Service) cancelOnAcceptance(ctx context.Context, b *bindings, rec client.Record, fresh bool, mark *client.CancelMark) (client.Record, error) {
	pending, err := s.acceptedPending(ctx, b, rec, fresh)
	if err != nil {
		return rec, err
	}
	if pending {
		req := rec.Request
		d := &lifecycle.Accepted{Common: rec.Common(), SubagentRevision: rec.SubagentRevision, Target: req.Target, Labels: req.Labels}
		if _, _, err := s.emit(ctx, b, d, rec.Traceparent); err != nil {
			return rec, err
		}
	}
	s.log.With(logging.Trace(rec.Traceparent)...).Info("re-dispatch of a cancelled thread: cancelled on acceptance",
		"dispatch_id", rec.DispatchID, "thread_id", rec.ThreadID, "parent_id", rec.ParentID)
	rec, err = s.cancelDispatch(ctx, b, rec.DispatchID, mark.By, mark.Reason)
	rec.Outcome = "" // an acceptance's answer, not a cancel's
	return rec, err
}

// acceptedTime gives the accepted event the time its record lists for
// it, so the projection finds the event already applied.
func acceptedTime(rec client.Record) lifecycle.Option {
	if rec.AcceptedAt == nil {
		return lifecycle.WithTime(time.Time{}) // now
	}
	return lifecycle.WithTime(*rec.AcceptedAt)
}

// parentCancel returns the cancel mark on the record of the dispatch a
// re-dispatch continues (its parent, paused on the question this round
// answers), or nil. The thread index lists rec before this read, so a
// cancel that marks the parent after it finds rec in the index.
func (s *Service) parentCancel(ctx context.Context, b *bindings, rec client.Record) (*client.CancelMark, error) {
	if rec.Round == 0 || rec.ParentID == "" || rec.Status != lifecycle.KindAccepted {
		return nil, nil
	}
	ctx, span := telemetry.Tracer().Start(ctx, "agora.dispatch.parent")
	parent, _, err := b.store.get(ctx, rec.ParentID)
	telemetry.End(span, ignoreNoRecord(err))
	switch {
	case errors.Is(err, errNoRecord):
		return nil, nil
	case err != nil:
		return nil, err
	case parent.ThreadID != rec.ThreadID:
		return nil, nil
	}
	return parent.CancelRequested, nil
}

func ignoreNoRecord(err error) error {
	if errors.Is(err, errNoRecord) {
		return nil
	}
	return err
}

// queue publishes the completed request on agora.dispatch.<subagent> with
// Nats-Msg-Id = dispatch id, so a repeat is dropped as a duplicate.
func (s *Service) queue(ctx context.Context, b *bindings, req *lifecycle.Request, traceparent string) error {
	e, err := lifecycle.New(s.source, req, telemetry.Event(ctx, traceparent))
	if err != nil {
		return fmt.Errorf("dispatcher: build request event: %w", err)
	}
	subj, err := lifecycle.DispatchSubject(req.Subagent)
	if err != nil {
		return err
	}
	msg, err := lifecycle.Encode(subj, e)
	if err != nil {
		return err
	}
	if _, err := b.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(lifecycle.StreamDispatch)); err != nil {
		return fmt.Errorf("dispatcher: queue %s: %w", req.DispatchID, err)
	}
	return nil
}

// emit publishes a lifecycle event carrying the dispatch's trace.
func (s *Service) emit(ctx context.Context, b *bindings, d lifecycle.Data, traceparent string) (lifecycle.Event, *jetstream.PubAck, error) {
	e, msg, err := lifecycle.Message(s.source, d, telemetry.Event(ctx, traceparent))
	if err != nil {
		return e, nil, fmt.Errorf("dispatcher: build event: %w", err)
	}
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(lifecycle.StreamLifecycle))
	if err != nil {
		return e, nil, fmt.Errorf("dispatcher: publish %s: %w", e.ID(), err)
	}
	return e, ack, nil
}

// eventExists looks for an event of kind k of the dispatch on the
// lifecycle stream.
func (s *Service) eventExists(ctx context.Context, b *bindings, k lifecycle.Kind, rec client.Record) (bool, error) {
	subj, err := lifecycle.LifecycleSubject(k, rec.ThreadID, rec.DispatchID)
	if err != nil {
		return false, err
	}
	_, err = b.events.GetLastMsgForSubject(ctx, subj)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	}
	return false, fmt.Errorf("dispatcher: look up %s: %w", subj, err)
}
