package lifecycle_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

func TestNew(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			e, err := lifecycle.New(testSource, s.data, lifecycle.WithTime(testTime))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			checkID(t, e.ID(), s.id)
			if e.SpecVersion() != "1.0" {
				t.Errorf("specversion = %q, want 1.0", e.SpecVersion())
			}
			if e.Source() != testSource {
				t.Errorf("source = %q, want %q", e.Source(), testSource)
			}
			if e.Type() != s.typ {
				t.Errorf("type = %q, want %q", e.Type(), s.typ)
			}
			if e.Subject() != s.ceSubj {
				t.Errorf("subject = %q, want %q", e.Subject(), s.ceSubj)
			}
			if !e.Time().Equal(testTime) {
				t.Errorf("time = %v, want %v", e.Time(), testTime)
			}
			if want := lifecycle.SchemaBase + s.schema; e.DataSchema() != want {
				t.Errorf("dataschema = %q, want %q", e.DataSchema(), want)
			}
			if e.DataContentType() != "application/json" {
				t.Errorf("datacontenttype = %q, want application/json", e.DataContentType())
			}
			if lifecycle.Traceparent(e) != "" {
				t.Errorf("traceparent = %q without WithTraceparent", lifecycle.Traceparent(e))
			}
			want, err := json.Marshal(s.data)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(e.Data(), want) {
				t.Errorf("data = %s, want %s", e.Data(), want)
			}
			subj, err := lifecycle.Subject(s.data)
			if err != nil {
				t.Fatalf("Subject: %v", err)
			}
			if subj != s.natsSubj {
				t.Errorf("Subject = %q, want %q", subj, s.natsSubj)
			}
		})
	}
}

// checkID compares an event id with the derived id want, or, when want is
// empty, checks it is a ULID.
func checkID(t *testing.T, got, want string) {
	t.Helper()
	if want == "" {
		if _, err := ulid.ParseStrict(got); err != nil {
			t.Errorf("id = %q, want a ULID: %v", got, err)
		}
		return
	}
	if got != want {
		t.Errorf("id = %q, want %q", got, want)
	}
}

func TestNewDefaultTimeIsNowUTC(t *testing.T) {
	before := time.Now()
	e, err := lifecycle.New(testSource, &lifecycle.Started{Common: common(), WorkerID: "w", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	if e.Time().Before(before.Add(-time.Second)) || e.Time().After(time.Now().Add(time.Second)) {
		t.Errorf("time = %v, want about now", e.Time())
	}
	if e.Time().Location() != time.UTC {
		t.Errorf("time zone = %v, want UTC", e.Time().Location())
	}
}

func TestNewIDsAreDeterministic(t *testing.T) {
	for _, s := range samples() {
		if s.id == "" {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			a, err := lifecycle.New("/agora/a/1", s.data)
			if err != nil {
				t.Fatal(err)
			}
			b, err := lifecycle.New("/agora/b/2", s.data, lifecycle.WithTime(testTime))
			if err != nil {
				t.Fatal(err)
			}
			if a.ID() != b.ID() {
				t.Errorf("ids differ between two builds: %q and %q", a.ID(), b.ID())
			}
		})
	}
	// Ids without a derivation are fresh every time.
	r := &lifecycle.Request{Subagent: subagent}
	a, _ := lifecycle.New(testSource, r)
	b, _ := lifecycle.New(testSource, r)
	if a.ID() == b.ID() {
		t.Errorf("two requests without dispatch id share id %q", a.ID())
	}
	// Two attempts and two escalations get distinct ids.
	s1, _ := lifecycle.New(testSource, &lifecycle.Started{Common: common(), Attempt: 1})
	s2, _ := lifecycle.New(testSource, &lifecycle.Started{Common: common(), Attempt: 2})
	if s1.ID() == s2.ID() {
		t.Errorf("attempts 1 and 2 share id %q", s1.ID())
	}
	e1, _ := lifecycle.New(testSource, question(lifecycle.QuestionEscalated, 1))
	e2, _ := lifecycle.New(testSource, question(lifecycle.QuestionEscalated, 2))
	if e1.ID() == e2.ID() {
		t.Errorf("escalations 1 and 2 share id %q", e1.ID())
	}
	if got := lifecycle.TerminalID(dispatchID); got != dispatchID+".terminal" {
		t.Errorf("TerminalID = %q", got)
	}
}

func TestValidate(t *testing.T) {
	withCommon := func(f func(*lifecycle.Common)) lifecycle.Common {
		c := common()
		f(&c)
		return c
	}
	type bad struct {
		name  string
		data  lifecycle.Data
		field string
	}
	var tests []bad
	for _, tok := range []string{"", "a.b", "a*", "*", ">", "a>", "a b", "a\tb", "a\nb"} {
		tests = append(tests,
			bad{"dispatch_id " + tok, &lifecycle.Accepted{Common: withCommon(func(c *lifecycle.Common) { c.DispatchID = tok })}, "dispatch_id"},
			bad{"thread_id " + tok, &lifecycle.Started{Common: withCommon(func(c *lifecycle.Common) { c.ThreadID = tok })}, "thread_id"},
			bad{"subagent " + tok, &lifecycle.Finished{Common: withCommon(func(c *lifecycle.Common) { c.Subagent = tok })}, "subagent"},
			bad{"request subagent " + tok, &lifecycle.Request{Subagent: tok}, "subagent"},
			bad{"needs_input question_id " + tok, &lifecycle.NeedsInput{Common: common(), QuestionID: tok, Question: "q"}, "question_id"},
			bad{"question question_id " + tok, func() lifecycle.Data { q := question(lifecycle.QuestionAsked, 0); q.QuestionID = tok; return q }(), "question_id"},
			bad{"question route " + tok, func() lifecycle.Data { q := question(lifecycle.QuestionAsked, 0); q.Route = tok; return q }(), "route"},
			bad{"answer question_id " + tok, &lifecycle.Answer{QuestionID: tok, Answer: "B"}, "question_id"},
		)
		if tok != "" { // an empty dispatch id in a request means "assign one"
			tests = append(tests, bad{"request dispatch_id " + tok, &lifecycle.Request{DispatchID: tok, Subagent: subagent}, "dispatch_id"})
		}
	}
	tests = append(tests,
		bad{"negative round", &lifecycle.Cancelled{Common: withCommon(func(c *lifecycle.Common) { c.Round = -1 })}, "round"},
		bad{"empty question", &lifecycle.NeedsInput{Common: common(), QuestionID: questionID}, "question"},
		bad{"unknown reason", &lifecycle.Failed{Common: common(), Reason: "exploded"}, "reason"},
		bad{"empty reason", &lifecycle.Failed{Common: common()}, "reason"},
		bad{"unknown question event", question("pending", 0), "event"},
		bad{"too long token", &lifecycle.Request{Subagent: strings.Repeat("a", 257)}, "subagent"},
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := lifecycle.Validate(tt.data)
			if err == nil {
				t.Fatal("Validate: nil error")
			}
			if !errors.Is(err, lifecycle.ErrInvalid) {
				t.Errorf("error %q does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.field+":") {
				t.Errorf("error %q does not name field %q", err, tt.field)
			}
			if _, err := lifecycle.New(testSource, tt.data); err == nil {
				t.Error("New accepted invalid data")
			}
		})
	}

	t.Run("valid samples", func(t *testing.T) {
		for _, s := range samples() {
			if err := lifecycle.Validate(s.data); err != nil {
				t.Errorf("%s: %v", s.name, err)
			}
		}
	})
	t.Run("nil", func(t *testing.T) {
		if err := lifecycle.Validate(nil); !errors.Is(err, lifecycle.ErrInvalid) {
			t.Errorf("Validate(nil) = %v, want ErrInvalid", err)
		}
	})
}

func TestEncode(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			e, m, err := lifecycle.Message(testSource, s.data, lifecycle.WithTime(testTime))
			if err != nil {
				t.Fatalf("Message: %v", err)
			}
			if m.Subject != s.natsSubj {
				t.Errorf("msg subject = %q, want %q", m.Subject, s.natsSubj)
			}
			wantHeaders := map[string]string{
				"ce-specversion": "1.0",
				"ce-id":          e.ID(),
				"ce-source":      testSource,
				"ce-type":        s.typ,
				"ce-subject":     s.ceSubj,
				"ce-time":        testTime.Format(time.RFC3339Nano),
				"ce-dataschema":  lifecycle.SchemaBase + s.schema,
				"content-type":   "application/json",
				"Nats-Msg-Id":    e.ID(),
			}
			if s.ceSubj == "" {
				delete(wantHeaders, "ce-subject")
			}
			for k, want := range wantHeaders {
				if got := m.Header.Get(k); got != want {
					t.Errorf("header %s = %q, want %q", k, got, want)
				}
			}
			for k := range m.Header {
				if _, ok := wantHeaders[k]; !ok {
					t.Errorf("unexpected header %s = %q", k, m.Header.Values(k))
				}
			}
			want, _ := json.Marshal(s.data)
			if !bytes.Equal(m.Data, want) {
				t.Errorf("body = %s, want %s", m.Data, want)
			}

			checkDecodes(t, m.Header, m.Data, e, s.data)
		})
	}
}

// decodeParse decodes an event from header and body and parses its data.
func decodeParse(t *testing.T, header nats.Header, body []byte) (lifecycle.Event, lifecycle.Data) {
	t.Helper()
	e, err := lifecycle.Decode(header, body)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	d, err := lifecycle.Parse(e)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return e, d
}

// checkDecodes checks that header and body decode to want and parse to
// data.
func checkDecodes(t *testing.T, header nats.Header, body []byte, want lifecycle.Event, data lifecycle.Data) {
	t.Helper()
	got, d := decodeParse(t, header, body)
	checkSameEvent(t, got, want)
	if !reflect.DeepEqual(d, data) {
		t.Errorf("Parse = %+v, want %+v", d, data)
	}
}

func checkSameEvent(t *testing.T, got, want lifecycle.Event) {
	t.Helper()
	if got.ID() != want.ID() || got.Source() != want.Source() || got.Type() != want.Type() ||
		got.Subject() != want.Subject() || !got.Time().Equal(want.Time()) || got.DataSchema() != want.DataSchema() ||
		got.DataContentType() != want.DataContentType() || got.SpecVersion() != want.SpecVersion() {
		t.Errorf("decoded event\n%s\nwant\n%s", got, want)
	}
	if lifecycle.Traceparent(got) != lifecycle.Traceparent(want) {
		t.Errorf("traceparent = %q, want %q", lifecycle.Traceparent(got), lifecycle.Traceparent(want))
	}
	if !bytes.Equal(got.Data(), want.Data()) {
		t.Errorf("data = %s, want %s", got.Data(), want.Data())
	}
}

func TestDecodeStructured(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			e, err := lifecycle.New(testSource, s.data, lifecycle.WithTime(testTime), lifecycle.WithTraceparent(lifecycle.NewTraceparent()))
			if err != nil {
				t.Fatal(err)
			}
			body, err := e.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			h := nats.Header{}
			h.Set("content-type", "application/cloudevents+json")
			checkDecodes(t, h, body, e, s.data)
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	_, good, err := lifecycle.Message(testSource, &lifecycle.Started{Common: common(), WorkerID: "w", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	without := func(k string) nats.Header {
		h := nats.Header{}
		for name, v := range good.Header {
			if name != k {
				h[name] = v
			}
		}
		return h
	}
	tests := []struct {
		name string
		h    nats.Header
		body []byte
	}{
		{"no headers, not JSON", nil, []byte("hello")},
		{"structured, broken JSON", nats.Header{"content-type": {"application/cloudevents+json"}}, []byte(`{"specversion":`)},
		{"binary without id", without("ce-id"), good.Data},
		{"binary without source", without("ce-source"), good.Data},
		{"binary without type", without("ce-type"), good.Data},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := lifecycle.Decode(tt.h, tt.body); err == nil {
				t.Error("Decode: nil error")
			}
		})
	}
}

func TestParseUnknownType(t *testing.T) {
	for _, typ := range []string{"dev.agora.dispatch.paused", "dev.agora.question.pending", "com.example.other", ""} {
		t.Run(typ, func(t *testing.T) {
			e := event.New()
			e.SetID("x")
			e.SetSource(testSource)
			e.SetType(typ)
			_ = e.SetData("application/json", map[string]string{"dispatch_id": "d"})
			_, err := lifecycle.Parse(e)
			if !errors.Is(err, lifecycle.ErrUnknownType) {
				t.Errorf("Parse error = %v, want ErrUnknownType", err)
			}
		})
	}
}

func TestParseRejectsBadData(t *testing.T) {
	t.Run("not JSON", func(t *testing.T) {
		e := event.New()
		e.SetID("x")
		e.SetSource(testSource)
		e.SetType(lifecycle.KindFinished.Type())
		e.DataEncoded = []byte("{")
		if _, err := lifecycle.Parse(e); err == nil || errors.Is(err, lifecycle.ErrUnknownType) {
			t.Errorf("Parse error = %v, want a data error", err)
		}
	})
	t.Run("question event does not match type", func(t *testing.T) {
		e, err := lifecycle.New(testSource, question(lifecycle.QuestionAnswered, 0))
		if err != nil {
			t.Fatal(err)
		}
		e.SetType(lifecycle.QuestionExpired.Type())
		if _, err := lifecycle.Parse(e); !errors.Is(err, lifecycle.ErrInvalid) {
			t.Errorf("Parse error = %v, want ErrInvalid", err)
		}
	})
}

// Large or odd JSON numbers must pass through untouched: Agora never
// round-trips sub-agent output through float64.
func TestRawJSONSurvives(t *testing.T) {
	const raw = `{"big":1e400,"precise":12345678901234567890123,"tiny":-1.5e-400,"list":[0.1,1E+2]}`
	tests := []struct {
		name string
		data lifecycle.Data
		get  func(lifecycle.Data) json.RawMessage
	}{
		{"finished output", &lifecycle.Finished{Common: common(), Output: json.RawMessage(raw)},
			func(d lifecycle.Data) json.RawMessage { return d.(*lifecycle.Finished).Output }},
		{"finished bare number output", &lifecycle.Finished{Common: common(), Output: json.RawMessage(`1e400`)},
			func(d lifecycle.Data) json.RawMessage { return d.(*lifecycle.Finished).Output }},
		{"needs_input partial_state", &lifecycle.NeedsInput{Common: common(), QuestionID: questionID, Question: "q", PartialState: json.RawMessage(raw)},
			func(d lifecycle.Data) json.RawMessage { return d.(*lifecycle.NeedsInput).PartialState }},
		{"request input", &lifecycle.Request{Subagent: subagent, Input: json.RawMessage(raw)},
			func(d lifecycle.Data) json.RawMessage { return d.(*lifecycle.Request).Input }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.get(tt.data)
			_, m, err := lifecycle.Message(testSource, tt.data)
			if err != nil {
				t.Fatalf("Message: %v", err)
			}
			if !bytes.Contains(m.Data, want) {
				t.Errorf("body %s does not hold %s verbatim", m.Data, want)
			}
			e, d := decodeParse(t, m.Header, m.Data)
			if got := tt.get(d); !bytes.Equal(got, want) {
				t.Errorf("after round trip = %s, want %s", got, want)
			}

			// Structured mode too.
			body, err := e.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			_, d2 := decodeParse(t, nats.Header{"content-type": {"application/cloudevents+json"}}, body)
			if got := tt.get(d2); !bytes.Equal(got, want) {
				t.Errorf("after structured round trip = %s, want %s", got, want)
			}
		})
	}
}

func TestTraceparent(t *testing.T) {
	root := lifecycle.NewTraceparent()
	if !lifecycle.ValidTraceparent(root) {
		t.Fatalf("NewTraceparent() = %q is not valid", root)
	}
	if other := lifecycle.NewTraceparent(); lifecycle.TraceID(other) == lifecycle.TraceID(root) {
		t.Errorf("two new traces share trace id %q", lifecycle.TraceID(root))
	}

	e, err := lifecycle.New(testSource, &lifecycle.Started{Common: common(), WorkerID: "w", Attempt: 1}, lifecycle.WithTraceparent(root))
	if err != nil {
		t.Fatal(err)
	}
	tp := lifecycle.Traceparent(e)
	if !lifecycle.ValidTraceparent(tp) {
		t.Fatalf("event traceparent %q is not valid", tp)
	}
	if lifecycle.TraceID(tp) != lifecycle.TraceID(root) {
		t.Errorf("trace id = %q, want %q", lifecycle.TraceID(tp), lifecycle.TraceID(root))
	}
	if tp == root || tp[36:52] == root[36:52] {
		t.Errorf("span id not renewed: %q from %q", tp, root)
	}
	if tp[53:] != root[53:] {
		t.Errorf("flags = %q, want %q", tp[53:], root[53:])
	}

	// The traceparent travels as a ce- header and survives decoding.
	m, err := lifecycle.Encode("agora.x", e)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get("ce-traceparent"); got != tp {
		t.Errorf("ce-traceparent = %q, want %q", got, tp)
	}
	d, err := lifecycle.Decode(m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if got := lifecycle.Traceparent(d); got != tp {
		t.Errorf("decoded traceparent = %q, want %q", got, tp)
	}

	invalid := []string{
		"",
		"garbage",
		"00-00000000000000000000000000000000-0123456789abcdef-01", // zero trace id
		"00-0123456789abcdef0123456789abcdef-0000000000000000-01", // zero span id
		"01-0123456789abcdef0123456789abcdef-0123456789abcdef-01", // unknown version
		"00-0123456789ABCDEF0123456789ABCDEF-0123456789abcdef-01", // upper case
		"00-0123456789abcdef0123456789abcdef-0123456789abcdef",    // no flags
		" 00-0123456789abcdef0123456789abcdef-0123456789abcdef-01",
	}
	for _, v := range invalid {
		if lifecycle.ValidTraceparent(v) {
			t.Errorf("ValidTraceparent(%q) = true", v)
		}
		if got := lifecycle.ChildTraceparent(v); got != "" {
			t.Errorf("ChildTraceparent(%q) = %q, want empty", v, got)
		}
		if got := lifecycle.TraceID(v); got != "" {
			t.Errorf("TraceID(%q) = %q, want empty", v, got)
		}
		e, err := lifecycle.New(testSource, &lifecycle.Started{Common: common(), Attempt: 1}, lifecycle.WithTraceparent(v))
		if err != nil {
			t.Fatal(err)
		}
		if got := lifecycle.Traceparent(e); got != "" {
			t.Errorf("New with traceparent %q set %q, want none", v, got)
		}
	}
}

func TestSource(t *testing.T) {
	if got := lifecycle.Source("worker", "w-1"); got != "/agora/worker/w-1" {
		t.Errorf("Source = %q", got)
	}
}

func TestSchemaNameUnknown(t *testing.T) {
	if _, err := lifecycle.SchemaName("dev.agora.dispatch.paused"); !errors.Is(err, lifecycle.ErrUnknownType) {
		t.Errorf("SchemaName error = %v, want ErrUnknownType", err)
	}
}

func TestDecodeStructuredOtherData(t *testing.T) {
	tests := []struct {
		name     string
		ct       string
		data     any
		wantData string
	}{
		{"text data", "text/plain", "hello \"world\"", `hello "world"`},
		{"no data", "", nil, ""},
		{"json without content type", "", map[string]int{"n": 1}, `{"n":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := event.New()
			e.SetID("id-1")
			e.SetSource(testSource)
			e.SetType(lifecycle.TypeAnswerSubmitted)
			if tt.data != nil {
				if err := e.SetData(tt.ct, tt.data); err != nil {
					t.Fatal(err)
				}
				if tt.ct == "" {
					e.SetDataContentType("")
				}
			}
			body, err := e.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			got, err := lifecycle.Decode(nats.Header{"content-type": {"application/cloudevents+json"}}, body)
			if err != nil {
				t.Fatalf("Decode %s: %v", body, err)
			}
			if got.ID() != "id-1" || got.Type() != lifecycle.TypeAnswerSubmitted || got.DataContentType() != tt.ct {
				t.Errorf("decoded %s", got)
			}
			if string(got.Data()) != tt.wantData {
				t.Errorf("data = %q, want %q", got.Data(), tt.wantData)
			}
		})
	}
}

// WithParentSpan carries the causing span's traceparent unchanged (a
// tracing receiver parents its span on it); an invalid one is dropped.
func TestWithParentSpan(t *testing.T) {
	parent := lifecycle.NewTraceparent()
	e, err := lifecycle.New(testSource, &lifecycle.Started{Common: common(), WorkerID: "w", Attempt: 1}, lifecycle.WithParentSpan(parent))
	if err != nil {
		t.Fatal(err)
	}
	if got := lifecycle.Traceparent(e); got != parent {
		t.Errorf("traceparent = %q, want %q unchanged", got, parent)
	}
	e, err = lifecycle.New(testSource, &lifecycle.Started{Common: common(), WorkerID: "w", Attempt: 1}, lifecycle.WithParentSpan("00-bad"))
	if err != nil {
		t.Fatal(err)
	}
	if got := lifecycle.Traceparent(e); got != "" {
		t.Errorf("invalid parent span carried as %q", got)
	}
}

// DerivedID gives the same identity the same id, another identity another,
// and a valid id either way.
func TestDerivedID(t *testing.T) {
	at := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	a, again := lifecycle.DerivedID(at, "source", "event-1"), lifecycle.DerivedID(at, "source", "event-1")
	b, c := lifecycle.DerivedID(at, "source", "event-2"), lifecycle.DerivedID(at, "sourc", "eevent-1")
	if a != again || a == b || a == c {
		t.Errorf("DerivedID: %s, again %s, another event %s, parts split otherwise %s", a, again, b, c)
	}
	if err := lifecycle.ValidToken(a); err != nil || len(a) != 26 {
		t.Errorf("DerivedID = %q (%v), want a ULID", a, err)
	}
}
