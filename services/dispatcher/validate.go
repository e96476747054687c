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

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/resume"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Decoding and validating a dispatch request, the first step of every
// door's acceptance (docs/dispatcher.md, "Three doors, one path";
// docs/wire.md, "The dispatch request").

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
		return req, problem.Invalid(client.FieldError{Field: "request", Message: `is empty: want a JSON object such as {"subagent": "planner", "input": {}}`})
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil {
		return req, nil
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return req, problem.Invalid(client.FieldError{Field: short(name), Message: "is not a field of a dispatch request (" + requestFields + ")"})
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return req, problem.Invalid(client.FieldError{Field: te.Field, Message: fmt.Sprintf("must be %s, not a JSON %s", jsonKind(te.Type), te.Value)})
	case errors.As(err, &te):
		return req, problem.Invalid(client.FieldError{Field: "request", Message: fmt.Sprintf("must be a JSON object, not a JSON %s", te.Value)})
	case errors.As(err, &se):
		return req, problem.Invalid(client.FieldError{Field: "request", Message: fmt.Sprintf("is not valid JSON (at byte %d): %v", se.Offset, err)})
	}
	return req, problem.Invalid(client.FieldError{Field: "request", Message: err.Error()})
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
	var fe fieldErrors
	if size > MaxRequestBytes {
		fe.add("request", "is %d bytes; the limit is %d", size, MaxRequestBytes)
	}
	fe.checkIDs(req)
	fe.checkRound(req)
	fe.checkRun(req)
	// A later round is the resume its question record makes, whatever
	// the request says; what follows checks that request.
	if req.Round > 0 && len(fe) == 0 {
		if err := resumeOf(ctx, b, req); err != nil {
			return subagent.Definition{}, 0, err
		}
	}
	fe.checkEnv(req.Env)
	fe.checkLabels(req.Labels)
	fe.checkRefs(req)
	def, rev, err := s.definitionOf(ctx, b, req, &fe)
	if err != nil {
		return def, 0, err
	}
	// The request may set only the variables the definition allows.
	if rev > 0 {
		fe.checkAllowed(def, req, s.cfg.Floor())
	}
	if len(fe) > 0 {
		return def, 0, problem.Invalid(fe...)
	}
	return def, rev, nil
}

// fieldErrors collects the fields at fault in a request, in the order
// validate finds them.
type fieldErrors []client.FieldError

func (fe *fieldErrors) add(field, format string, a ...any) {
	*fe = append(*fe, client.FieldError{Field: field, Message: fmt.Sprintf(format, a...)})
}

// checkIDs checks the sub-agent's name and the request's ids.
func (fe *fieldErrors) checkIDs(req *lifecycle.Request) {
	switch {
	case req.Subagent == "":
		fe.add("subagent", "is required")
	case !subagent.ValidName(req.Subagent):
		fe.add("subagent", "%q is not a sub-agent name: 1-64 letters, digits, '-' or '_'", short(req.Subagent))
	}
	for _, f := range []struct{ name, v string }{{"dispatch_id", req.DispatchID}, {"thread_id", req.ThreadID}, {"parent_id", req.ParentID}} {
		if f.v != "" && !idRE.MatchString(f.v) {
			fe.add(f.name, "%q is not a valid id: 1-128 letters, digits, '-', '_' or '='", short(f.v))
		}
	}
	if req.QuestionID != "" && !questionRE.MatchString(req.QuestionID) {
		fe.add("question_id", "%q is not a valid id: 1-200 letters, digits, '-', '_' or '='", short(req.QuestionID))
	}
}

// checkRound checks that the round agrees with the thread and parent: a
// root dispatch starts its own thread, a later round continues one.
func (fe *fieldErrors) checkRound(req *lifecycle.Request) {
	switch {
	case req.Round < 0:
		fe.add("round", "%d is negative", req.Round)
	case req.Round == 0:
		if req.ParentID != "" {
			fe.add("parent_id", "must be empty for a root dispatch (round 0)")
		}
		if req.ThreadID != "" && req.ThreadID != req.DispatchID {
			fe.add("thread_id", "a root dispatch (round 0) starts its own thread: leave thread_id empty or equal to dispatch_id")
		}
	default:
		if req.ThreadID == "" {
			fe.add("thread_id", "is required when round > 0 (a re-dispatch continues a thread)")
		}
		if req.ParentID == "" {
			fe.add("parent_id", "is required when round > 0 (the dispatch whose question was answered)")
		}
	}
}

// checkRun checks the input, the timeout and max_rounds.
func (fe *fieldErrors) checkRun(req *lifecycle.Request) {
	if in := bytes.TrimSpace(req.Input); len(in) > 0 && !bytes.Equal(in, []byte("null")) {
		if in[0] != '{' {
			fe.add("input", "must be a JSON object, not %s", jsonValueKind(in))
		}
		if len(in) > MaxInputBytes {
			fe.add("input", "is %d bytes; the limit is %d (pass large data by reference)", len(in), MaxInputBytes)
		}
	}
	if req.Timeout != "" {
		if d, err := time.ParseDuration(req.Timeout); err != nil || d <= 0 {
			fe.add("timeout", "%q is not a positive duration such as 30m or 1h30m", short(req.Timeout))
		}
	}
	if req.MaxRounds < 0 {
		fe.add("max_rounds", "%d is negative", req.MaxRounds)
	}
}

// checkEnv checks the variables the request sets.
func (fe *fieldErrors) checkEnv(env map[string]string) {
	if len(env) > MaxEntries {
		fe.add("env", "has %d entries; the limit is %d", len(env), MaxEntries)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		switch {
		case !subagent.ValidEnvName(k):
			fe.add("env", "%q is not a valid variable name (letters, digits and '_', not starting with a digit)", short(k))
		case subagent.Reserved(k):
			fe.add("env", "%q is reserved: a sub-agent never gets AGORA_* or NATS_* variables", k)
		case strings.ContainsRune(env[k], 0):
			fe.add("env", "the value of %s contains a NUL byte", k)
		}
	}
}

// checkLabels checks the request's labels.
func (fe *fieldErrors) checkLabels(labels map[string]string) {
	if len(labels) > MaxEntries {
		fe.add("labels", "has %d entries; the limit is %d", len(labels), MaxEntries)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		switch {
		case k == "" || len(k) > MaxLabelBytes:
			fe.add("labels", "a key must be 1 to %d bytes", MaxLabelBytes)
		case len(labels[k]) > MaxLabelBytes:
			fe.add("labels", "the value of %q is longer than %d bytes", short(k), MaxLabelBytes)
		}
	}
}

// checkRefs checks the target and the partial state's reference.
func (fe *fieldErrors) checkRefs(req *lifecycle.Request) {
	if len(req.Target) > MaxTargetBytes {
		fe.add("target", "is %d bytes; the limit is %d", len(req.Target), MaxTargetBytes)
	}
	if r := req.PartialStateRef; r != "" && (len(r) > 1024 || !utf8.ValidString(r) || strings.ContainsFunc(r, func(c rune) bool { return c < 0x20 || c == 0x7f })) {
		fe.add("partial_state_ref", "must be a printable name of at most 1024 bytes")
	}
}

// definitionOf reads the registered definition of the request's
// sub-agent. A definition that is missing or unreadable is a field at
// fault (rev 0); any error returned is temporary.
func (s *Service) definitionOf(ctx context.Context, b *bindings, req *lifecycle.Request, fe *fieldErrors) (subagent.Definition, uint64, error) {
	if !subagent.ValidName(req.Subagent) {
		return subagent.Definition{}, 0, nil
	}
	d, err := s.lookup(ctx, b, req.Subagent, false)
	if err == nil && d.rev > 0 && s.refuses(d.def, req) {
		// A refusal names the stored revision, not a copy that may
		// lag an apply made a moment ago.
		d, err = s.lookup(ctx, b, req.Subagent, true)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		fe.add("subagent", "no sub-agent named %q is registered (agora subagent apply -f FILE)", req.Subagent)
	case err != nil:
		return subagent.Definition{}, 0, err
	case d.err != nil:
		fe.add("subagent", "the registered definition of %q cannot be read: %v", req.Subagent, d.err)
	default:
		return d.def, d.rev, nil
	}
	return subagent.Definition{}, 0, nil
}

// checkAllowed checks the request against what its definition allows:
// the variables of its env_allow, a timeout no longer than its own, and
// the operator's floor — a definition stored before the floor was raised
// (or by a writer that skipped apply's check) never runs.
func (fe *fieldErrors) checkAllowed(def subagent.Definition, req *lifecycle.Request, floor subagent.Floor) {
	for _, k := range envRefused(def, req.Env) {
		what := "is not in"
		if subagent.Hook(k) {
			what = "is a loader or interpreter hook, and not in"
		}
		fe.add("env", "%q %s the sub-agent's env_allow %v: a request may set only the variables its definition allows", k, what, def.EnvAllow)
	}
	if longer(def, req) {
		fe.add("timeout", "%q is longer than the sub-agent's timeout %s: a request can only shorten it", short(req.Timeout), defTimeout(def))
	}
	var floorErr *subagent.FloorError
	if errors.As(def.Sandbox.CheckFloor(floor), &floorErr) {
		for _, p := range floorErr.Problems {
			fe.add("subagent", "the registered definition of %q is below the operator's sandbox floor: %s", req.Subagent, p)
		}
	}
}

// resumeOf replaces a later round's request with the resume its question
// record makes (internal/resume; docs/security.md, "A resume only the
// router can make"). Only the router writes question records, and it
// writes the answer, who gave it and the thread's next dispatch id there
// before it publishes the re-dispatch; so a request — through any door,
// with any credentials — can neither forge an answer, a partial state or
// who answered, nor resume a thread that is not paused on that question.
// A request that is not its question's resume gets a *client.Problem
// naming what does not match; any other error is temporary.
func resumeOf(ctx context.Context, b *bindings, req *lifecycle.Request) error {
	qid := lifecycle.QuestionID(req.ParentID)
	refuse := func(why string) error {
		return problem.Invalid(client.FieldError{Field: "round", Message: fmt.Sprintf(
			"%d: %s. A later round is made only by the router, from the answer it accepted: answer the question instead (agora answer %s, POST /v1/questions/%s/answer)",
			req.Round, why, qid, qid)})
	}
	r, err := resumeRecord(ctx, b, req)
	switch {
	case errors.Is(err, errNoQuestion):
		return refuse(fmt.Sprintf("parent_id %q has no question (%s) to resume from", short(req.ParentID), qid))
	case errors.Is(err, errUnreadableQuestion):
		return refuse(fmt.Sprintf("the record of question %s cannot be read: %v", qid, err))
	case err != nil:
		return fmt.Errorf("dispatcher: question %s: %w", qid, err)
	}
	if err := resume.Check(r, req); err != nil {
		return refuse(err.Error())
	}
	built, err := resume.Build(r)
	if err != nil {
		return fmt.Errorf("dispatcher: %w", err)
	}
	// Every field the router sets must be the resume's; what the
	// dispatcher fills in counts only when the request sets it otherwise.
	var ce *conflictError
	if errors.As(requestConflict(built, *req), &ce) {
		var fields []string
		for _, f := range ce.p.Errors {
			fields = append(fields, f.Field)
		}
		return refuse(fmt.Sprintf("%s differ from the resume of question %s, which the router made from its answer", strings.Join(fields, ", "), qid))
	}
	*req = *built
	return nil
}

// The question records resumeRecord cannot use: none, or one that is not
// a record; any other error of it is temporary.
var (
	errNoQuestion         = errors.New("no question record")
	errUnreadableQuestion = errors.New("not a question record")
)

// resumeRecord reads the question record req's resume is made from. A
// record that is missing or does not make this resume is read again from
// the bucket stream's leader before it counts: in a cluster a direct get
// may be answered by a replica that has not applied yet the router's write
// that comes before its re-dispatch (docs/security.md, "A resume only the
// router can make").
func resumeRecord(ctx context.Context, b *bindings, req *lifecycle.Request) (*resume.Record, error) {
	qid := lifecycle.QuestionID(req.ParentID)
	decode := func(data []byte) (*resume.Record, error) {
		var r resume.Record
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("%w: %v", errUnreadableQuestion, err)
		}
		return &r, nil
	}
	e, err := b.store.questions.Get(ctx, qid)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	if err == nil {
		if r, derr := decode(e.Value()); derr == nil && resume.Check(r, req) == nil {
			return r, nil
		}
	}
	data, found, err := leaderGet(ctx, b.js.Conn(), "KV_"+lifecycle.BucketQuestions, "$KV."+lifecycle.BucketQuestions+"."+qid)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, errNoQuestion
	}
	return decode(data)
}

// leaderGet reads the last message of subject in stream through the
// stream's leader ($JS.API.STREAM.MSG.GET, not a direct get, which any
// replica may answer). found is false when there is none, or when the last
// is a KV delete or purge marker.
func leaderGet(ctx context.Context, nc *nats.Conn, stream, subject string) (data []byte, found bool, err error) {
	body, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, false, fmt.Errorf("leader get %s: %w", subject, err)
	}
	var resp struct {
		Message *struct {
			Data []byte `json:"data"`
			Hdrs []byte `json:"hdrs"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, false, fmt.Errorf("leader get %s: %w", subject, err)
	}
	switch {
	case resp.Error != nil && resp.Error.Code == 404:
		return nil, false, nil
	case resp.Error != nil:
		return nil, false, fmt.Errorf("leader get %s: %d %s", subject, resp.Error.Code, resp.Error.Description)
	case resp.Message == nil:
		return nil, false, fmt.Errorf("leader get %s: no message in the reply", subject)
	}
	if bytes.Contains(resp.Message.Hdrs, []byte("KV-Operation: DEL")) || bytes.Contains(resp.Message.Hdrs, []byte("KV-Operation: PURGE")) {
		return nil, false, nil
	}
	return resp.Message.Data, true, nil
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
