package lifecycle

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
)

// Event is a CloudEvents 1.0 event.
type Event = event.Event

// ErrUnknownType reports an event whose type is not in Agora's vocabulary.
// Consumers log and skip such events.
var ErrUnknownType = errors.New("lifecycle: unknown event type")

// ErrInvalid reports event data that breaks the contract.
var ErrInvalid = errors.New("lifecycle: invalid event data")

// TraceparentExtension is the Distributed Tracing extension attribute.
const TraceparentExtension = "traceparent"

// ContentTypeJSON is the datacontenttype of every Agora event.
const ContentTypeJSON = "application/json"

// SchemaBase prefixes every dataschema; the rest is the schema file's name
// under schema/cloudevents/.
const SchemaBase = "https://raw.githubusercontent.com/agora-dispatch/agora/main/schema/cloudevents/"

// NewID returns a new ULID string: unique and sortable by creation time.
func NewID() string { return ulid.Make().String() }

// DerivedID returns the ULID that the identity parts give at time t: the
// same parts and time always give the same id, so a message handled again
// (a redelivery) names the same dispatch.
func DerivedID(t time.Time, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	id, err := ulid.New(ulid.Timestamp(t), bytes.NewReader(h.Sum(nil)[:10]))
	if err != nil {
		return NewID() // t outside ULID's range
	}
	return id.String()
}

// Source returns the CloudEvents source of a service instance:
// /agora/<service>/<instance>.
func Source(service, instance string) string { return "/agora/" + service + "/" + instance }

// SchemaName returns the schema file name (without directory) describing
// the data of an event type, e.g. "dispatch.finished.json". All question
// events share "question.json".
func SchemaName(eventType string) (string, error) {
	switch {
	case eventType == TypeRequested:
		return "dispatch.requested.json", nil
	case eventType == TypeAnswerSubmitted:
		return "answer.submitted.json", nil
	case eventType == TypeProgress:
		return "progress.reported.json", nil
	}
	for _, k := range Kinds() {
		if k.Type() == eventType {
			return "dispatch." + string(k) + ".json", nil
		}
	}
	for _, q := range QuestionEvents() {
		if q.Type() == eventType {
			return "question.json", nil
		}
	}
	return "", fmt.Errorf("%w: %q", ErrUnknownType, eventType)
}

type options struct {
	traceparent string
	exact       bool // traceparent is the causing span's own
	time        time.Time
}

// Option adjusts an event built by New.
type Option func(*options)

// WithTraceparent carries a W3C traceparent from the cause of this event.
// The event gets the same trace id and a new span id. An invalid value is
// ignored.
func WithTraceparent(tp string) Option {
	return func(o *options) { o.traceparent, o.exact = tp, false }
}

// WithParentSpan carries the traceparent of the span that caused this
// event unchanged, so a tracing receiver's span becomes that span's child
// (docs/tracing.md). An invalid value is ignored.
func WithParentSpan(tp string) Option {
	return func(o *options) { o.traceparent, o.exact = tp, true }
}

// WithTime sets the event time (default: now, UTC).
func WithTime(t time.Time) Option { return func(o *options) { o.time = t } }

// New builds the CloudEvent for d, filling id, source, type, subject, time,
// datacontenttype and dataschema. Ids are derived so that a retried publish
// is a duplicate: <dispatch_id>.accepted, <dispatch_id>.started.<attempt>,
// <dispatch_id>.terminal for the four terminal kinds, <question_id>.<event>
// for question events (<question_id>.escalated.<n> for escalations), the
// dispatch id for a request that has one; otherwise a new ULID.
func New(source string, d Data, opts ...Option) (Event, error) {
	if err := Validate(d); err != nil {
		return Event{}, err
	}
	o := options{}
	for _, f := range opts {
		f(&o)
	}
	if o.time.IsZero() {
		o.time = time.Now().UTC()
	}
	schema, err := SchemaName(d.eventType())
	if err != nil {
		return Event{}, err
	}
	e := event.New()
	e.SetID(eventID(d))
	e.SetSource(source)
	e.SetType(d.eventType())
	e.SetTime(o.time)
	e.SetDataSchema(SchemaBase + schema)
	if s := eventSubject(d); s != "" {
		e.SetSubject(s)
	}
	switch {
	case o.exact && ValidTraceparent(o.traceparent):
		e.SetExtension(TraceparentExtension, o.traceparent)
	case !o.exact:
		if tp := ChildTraceparent(o.traceparent); tp != "" {
			e.SetExtension(TraceparentExtension, tp)
		}
	}
	if err := e.SetData(ContentTypeJSON, d); err != nil {
		return Event{}, fmt.Errorf("lifecycle: encode data: %w", err)
	}
	if err := e.Validate(); err != nil {
		return Event{}, fmt.Errorf("lifecycle: %w", err)
	}
	return e, nil
}

// TerminalID is the event id of a dispatch's one terminal event.
func TerminalID(dispatchID string) string { return dispatchID + ".terminal" }

// AcceptedID is the event id of a dispatch's accepted event.
func AcceptedID(dispatchID string) string { return dispatchID + ".accepted" }

func eventID(d Data) string {
	switch v := d.(type) {
	case *Request:
		if v.DispatchID != "" {
			return v.DispatchID
		}
	case *Accepted:
		return AcceptedID(v.DispatchID)
	case *Started:
		return v.DispatchID + ".started." + strconv.Itoa(v.Attempt)
	case *Finished:
		return TerminalID(v.DispatchID)
	case *NeedsInput:
		return TerminalID(v.DispatchID)
	case *Failed:
		return TerminalID(v.DispatchID)
	case *Cancelled:
		return TerminalID(v.DispatchID)
	case *Progress:
		return v.DispatchID + ".progress." + strconv.Itoa(v.Attempt) + "." + strconv.Itoa(v.Seq)
	case *Question:
		if v.Event == QuestionEscalated {
			return v.QuestionID + ".escalated." + strconv.Itoa(v.Escalation)
		}
		return v.QuestionID + "." + string(v.Event)
	}
	return NewID()
}

func eventSubject(d Data) string {
	switch v := d.(type) {
	case *Request:
		return v.DispatchID
	case Lifecycle:
		return v.Base().DispatchID
	case *Question:
		return v.QuestionID
	case *Answer:
		return v.QuestionID
	case *Progress:
		return v.DispatchID
	}
	return ""
}

// Subject returns the NATS subject d is published on: agora.requests.<subagent>
// for a request, the lifecycle, question or answer subject otherwise.
func Subject(d Data) (string, error) {
	switch v := d.(type) {
	case *Request:
		return RequestSubject(v.Subagent)
	case Lifecycle:
		c := v.Base()
		return LifecycleSubject(v.LifecycleKind(), c.ThreadID, c.DispatchID)
	case *Question:
		return QuestionSubject(v.Route, v.QuestionID, v.Event)
	case *Answer:
		return AnswerSubject(v.Route, v.QuestionID)
	case *Progress:
		return ProgressSubject(v.ThreadID, v.DispatchID)
	}
	return "", fmt.Errorf("%w: %T", ErrUnknownType, d)
}

// Validate checks d against the contract: ids and names are subject tokens,
// reasons and events are in their closed sets.
func Validate(d Data) error {
	bad := func(field string, err error) error { return fmt.Errorf("%w: %s: %v", ErrInvalid, field, err) }
	checkCommon := func(c Common) error {
		if err := ValidToken(c.DispatchID); err != nil {
			return bad("dispatch_id", err)
		}
		if err := ValidToken(c.ThreadID); err != nil {
			return bad("thread_id", err)
		}
		if err := ValidToken(c.Subagent); err != nil {
			return bad("subagent", err)
		}
		if c.Round < 0 {
			return bad("round", errors.New("negative"))
		}
		return nil
	}
	switch v := d.(type) {
	case nil:
		return fmt.Errorf("%w: nil data", ErrInvalid)
	case *Request:
		if err := ValidToken(v.Subagent); err != nil {
			return bad("subagent", err)
		}
		if v.DispatchID != "" {
			if err := ValidToken(v.DispatchID); err != nil {
				return bad("dispatch_id", err)
			}
		}
		return nil
	case *Failed:
		if !v.Reason.Valid() {
			return bad("reason", fmt.Errorf("%q is not a failure reason", v.Reason))
		}
		return checkCommon(v.Common)
	case *NeedsInput:
		if err := ValidToken(v.QuestionID); err != nil {
			return bad("question_id", err)
		}
		if v.Question == "" {
			return bad("question", errors.New("empty"))
		}
		return checkCommon(v.Common)
	case Lifecycle:
		return checkCommon(v.Base())
	case *Question:
		if !v.Event.Valid() {
			return bad("event", fmt.Errorf("%q is not a question event", v.Event))
		}
		if err := ValidToken(v.QuestionID); err != nil {
			return bad("question_id", err)
		}
		if err := ValidToken(v.Route); err != nil {
			return bad("route", err)
		}
		return checkCommon(v.Common)
	case *Answer:
		if err := ValidToken(v.QuestionID); err != nil {
			return bad("question_id", err)
		}
		return nil
	case *Progress:
		if v.Attempt < 1 || v.Seq < 1 {
			return bad("attempt, seq", errors.New("start at 1"))
		}
		return checkCommon(v.Common)
	}
	return fmt.Errorf("%w: %T", ErrUnknownType, d)
}

// Encode maps e to a NATS message on subject in CloudEvents binary content
// mode: ce-* headers, content-type, the JSON data as the body, and
// Nats-Msg-Id set to the event id so a retried publish is dropped by the
// stream's duplicate window.
func Encode(subject string, e Event) (*nats.Msg, error) {
	if h, ok := binaryHeader(e); ok {
		h.Set(jetstream.MsgIDHeader, e.ID())
		var data []byte
		if d := e.Data(); len(d) > 0 {
			data = bytes.Clone(d)
		}
		return &nats.Msg{Subject: subject, Header: h, Data: data}, nil
	}
	return encodeSDK(subject, e)
}

// encodeSDK is Encode through the CloudEvents SDK's binding, for an event
// binaryHeader leaves to it.
func encodeSDK(subject string, e Event) (*nats.Msg, error) {
	var buf bytes.Buffer
	h, err := cejs.WriteMsg(binding.WithForceBinary(context.Background()), binding.ToMessage(&e), &buf)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: encode %s: %w", e.ID(), err)
	}
	if ct := h.Get("ce-datacontenttype"); ct != "" {
		h.Del("ce-datacontenttype")
		h.Set("content-type", ct)
	}
	h.Set(jetstream.MsgIDHeader, e.ID())
	return &nats.Msg{Subject: subject, Header: h, Data: buf.Bytes()}, nil
}

// Message builds the event for d with New and encodes it on Subject(d).
func Message(source string, d Data, opts ...Option) (Event, *nats.Msg, error) {
	e, err := New(source, d, opts...)
	if err != nil {
		return Event{}, nil, err
	}
	subj, err := Subject(d)
	if err != nil {
		return Event{}, nil, err
	}
	m, err := Encode(subj, e)
	return e, m, err
}

// Decode reads a CloudEvent from a NATS message's header and body, in
// binary mode (ce-* headers) or structured mode
// (application/cloudevents+json body).
func Decode(h nats.Header, data []byte) (Event, error) {
	m := cejs.NewMessage(&nats.Msg{Header: h, Data: data})
	var e *Event
	var err error
	if m.ReadEncoding() == binding.EncodingStructured {
		e, err = decodeStructured(data)
	} else {
		e, err = binding.ToEvent(context.Background(), m)
	}
	if err != nil {
		return Event{}, fmt.Errorf("lifecycle: decode: %w", err)
	}
	if err := e.Validate(); err != nil {
		return Event{}, fmt.Errorf("lifecycle: decode: %w", err)
	}
	return *e, nil
}

// decodeStructured reads a structured-mode event. The sdk-go decoder
// (jsoniter) refuses JSON numbers outside float64 range, such as 1e400,
// inside data; Agora carries sub-agent JSON verbatim, so JSON data is split
// off with encoding/json, which keeps it byte for byte, and the attributes
// are decoded by sdk-go.
func decodeStructured(body []byte) (*Event, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, err
	}
	data, hasData := members["data"]
	delete(members, "data")
	attrs, err := json.Marshal(members)
	if err != nil {
		return nil, err
	}
	e := new(Event)
	if err := e.UnmarshalJSON(attrs); err != nil {
		return nil, err
	}
	if !hasData {
		return e, nil
	}
	switch mt, _ := e.Context.GetDataMediaType(); mt {
	case "", event.ApplicationJSON, event.TextJSON:
		e.DataEncoded = data
		return e, nil
	}
	// Other media types carry data as a JSON string: let sdk-go decode it.
	e = new(Event)
	if err := e.UnmarshalJSON(body); err != nil {
		return nil, err
	}
	return e, nil
}

// DecodeMsg decodes a JetStream message with Decode.
func DecodeMsg(m jetstream.Msg) (Event, error) { return Decode(m.Headers(), m.Data()) }

// Parse decodes e's data into its typed value. An event type outside the
// vocabulary answers an error wrapping ErrUnknownType.
func Parse(e Event) (Data, error) {
	var d Data
	switch t := e.Type(); t {
	case TypeRequested:
		d = new(Request)
	case TypeAnswerSubmitted:
		d = new(Answer)
	case TypeProgress:
		d = new(Progress)
	case KindAccepted.Type():
		d = new(Accepted)
	case KindStarted.Type():
		d = new(Started)
	case KindFinished.Type():
		d = new(Finished)
	case KindNeedsInput.Type():
		d = new(NeedsInput)
	case KindFailed.Type():
		d = new(Failed)
	case KindCancelled.Type():
		d = new(Cancelled)
	default:
		var q *Question
		for _, ev := range QuestionEvents() {
			if ev.Type() == t {
				q = &Question{}
			}
		}
		if q == nil {
			return nil, fmt.Errorf("%w: %q (id %s)", ErrUnknownType, t, e.ID())
		}
		d = q
	}
	if err := json.Unmarshal(e.Data(), d); err != nil {
		return nil, fmt.Errorf("lifecycle: %s %s: data: %w", e.Type(), e.ID(), err)
	}
	if q, ok := d.(*Question); ok && q.Event.Type() != e.Type() {
		return nil, fmt.Errorf("%w: question event %q does not match type %q", ErrInvalid, q.Event, e.Type())
	}
	return d, nil
}

// Traceparent returns e's traceparent extension, or "".
func Traceparent(e Event) string {
	v, ok := e.Extensions()[TraceparentExtension]
	if !ok {
		return ""
	}
	s, _ := v.(string)
	return s
}

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$`)

// ValidTraceparent reports whether tp is a W3C traceparent (version 00) with
// non-zero trace and span ids.
func ValidTraceparent(tp string) bool {
	m := traceparentRE.FindStringSubmatch(tp)
	return m != nil && m[1] != "00000000000000000000000000000000" && m[2] != "0000000000000000"
}

// NewTraceparent starts a new sampled trace.
func NewTraceparent() string {
	return "00-" + randHex(16) + "-" + randHex(8) + "-01"
}

// ChildTraceparent keeps parent's trace id and flags with a new span id, so
// every event a request causes, across rounds, belongs to one trace. It
// returns "" when parent is not a valid traceparent.
func ChildTraceparent(parent string) string {
	if !ValidTraceparent(parent) {
		return ""
	}
	m := traceparentRE.FindStringSubmatch(parent)
	return "00-" + m[1] + "-" + randHex(8) + "-" + m[3]
}

// TraceID returns the trace id of a valid traceparent, or "".
func TraceID(tp string) string {
	if !ValidTraceparent(tp) {
		return ""
	}
	return traceparentRE.FindStringSubmatch(tp)[1]
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
