package schema_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/schema"
)

func compile(t *testing.T) *schema.Set {
	t.Helper()
	s, err := schema.Compile()
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return s
}

const (
	dispatchID = "01JD3Q8Z5X6Y7W8V9T0S1R2Q3P"
	threadID   = "01JD3Q7A1B2C3D4E5F6G7H8J9K"
	parentID   = "01JD3Q6M4N5P6Q7R8S9T0V1W2X"
)

func common(round int) lifecycle.Common {
	c := lifecycle.Common{DispatchID: dispatchID, ThreadID: threadID, Subagent: "planner", Round: round}
	if round > 0 {
		c.ParentID = parentID
	}
	return c
}

func intp(i int) *int { return &i }

// goldenData is every data type with realistic values: the request in its
// three shapes, the six kinds, every failure reason, every question event
// and the answer.
func goldenData() map[string]lifecycle.Data {
	asked := time.Date(2025, 11, 21, 9, 30, 0, 0, time.UTC)
	deadline := asked.Add(4 * time.Hour)
	answered := asked.Add(17 * time.Minute)
	question := func(ev lifecycle.QuestionEvent) *lifecycle.Question {
		q := &lifecycle.Question{
			Common:     common(0),
			QuestionID: lifecycle.QuestionID(dispatchID),
			Event:      ev,
			Status:     string(ev),
			Route:      "approvals",
			Answerer:   "human",
			Question:   "Rewrite function A or B?",
			Options:    []string{"A", "B"},
			Context:    "Same signature, different call sites.",
			Kind:       "approval",
			Target:     "github.com/acme/payments#412",
			Labels:     map[string]string{"team": "payments"},
			AskedAt:    asked,
			Deadline:   &deadline,
		}
		switch ev {
		case lifecycle.QuestionAnswered:
			q.Answer, q.Decision, q.AnsweredBy, q.AnsweredAt = "B", "approve", "alice@example.com", &answered
		case lifecycle.QuestionEscalated:
			q.Status, q.Escalation, q.Detail = "asked", 1, "no answer after 1h; escalated to oncall"
		case lifecycle.QuestionExpired:
			q.Detail = "deadline passed"
		case lifecycle.QuestionWithdrawn:
			q.Detail = "dispatch cancelled"
		case lifecycle.QuestionJoined:
			q.Status, q.JoinedTo = "joined", "q-01JD3Q7A1B2C3D4E5F6G7H8J9K"
		case lifecycle.QuestionReversed:
			q.Status, q.Answer, q.Decision, q.AnsweredBy, q.AnsweredAt = "answered", "A", "approve", "alice@example.com", &answered
			q.Suggestion = &lifecycle.Suggestion{Answer: "B", Decision: "approve", Confidence: 0.95, By: "agent", At: answered, Accepted: true}
			q.Reversal = &lifecycle.Reversal{By: "alice@example.com", At: answered, SuggestionBy: "agent", SuggestionAnswer: "B",
				CancelledDispatchID: "01JD3Q9A1B2C3D4E5F6G7H8J9K", NextDispatchID: "01JD3Q9B1B2C3D4E5F6G7H8J9K"}
		}
		return q
	}
	d := map[string]lifecycle.Data{
		"request root": &lifecycle.Request{
			Subagent:  "planner",
			Input:     json.RawMessage(`{"task":"split the payments module","limits":{"files":20}}`),
			Target:    "github.com/acme/payments",
			Env:       map[string]string{"LOG_LEVEL": "debug"},
			Labels:    map[string]string{"team": "payments"},
			Timeout:   "30m",
			MaxRounds: 10,
		},
		"request with client id": &lifecycle.Request{DispatchID: "order-4711", Subagent: "planner",
			Input: json.RawMessage(`{}`), Timeout: "1h30m"},
		"request re-dispatch": &lifecycle.Request{
			DispatchID:       dispatchID,
			Subagent:         "planner",
			Input:            json.RawMessage(`{"task":"split","answer":{"answer":"B","answered_by":"alice@example.com"}}`),
			Timeout:          "1.5h",
			MaxRounds:        10,
			ThreadID:         threadID,
			ParentID:         parentID,
			Round:            1,
			QuestionID:       lifecycle.QuestionID(parentID),
			PartialStateRef:  parentID,
			SubagentRevision: 7,
		},
		"accepted": &lifecycle.Accepted{Common: common(0), SubagentRevision: 7,
			Target: "github.com/acme/payments", Labels: map[string]string{"team": "payments"}},
		"accepted minimal": &lifecycle.Accepted{Common: common(1), SubagentRevision: 1},
		"started":          &lifecycle.Started{Common: common(0), WorkerID: "worker-7c9f/3", Attempt: 1},
		"finished": &lifecycle.Finished{Common: common(1), DurationMS: 41237,
			Output: json.RawMessage(`{"plan":["extract","move","test"]}`), StdoutTail: "done\n", StderrTail: "warning: slow disk\n"},
		"finished without output": &lifecycle.Finished{Common: common(0), DurationMS: 12},
		"finished with artifacts": &lifecycle.Finished{Common: common(0), DurationMS: 12, Outputs: lifecycle.Outputs{
			Artifacts: []lifecycle.Artifact{{Name: "patches/fix.diff", Size: 120, SHA256: strings.Repeat("ab", 32),
				ContentType: "text/x-diff; charset=utf-8", Ref: dispatchID + "/patches/fix.diff"}},
			ArtifactsSkipped: []lifecycle.SkippedArtifact{{Name: "link", Reason: "a symlink, not a regular file"}}}},
		"finished shrunk to fit": &lifecycle.Finished{Common: common(0), DurationMS: 12, OutputDropped: "70000 bytes of output.json dropped",
			Outputs: lifecycle.Outputs{
				Artifacts: []lifecycle.Artifact{{Name: "a.txt", Size: 1, SHA256: strings.Repeat("cd", 32),
					ContentType: "text/plain; charset=utf-8", Ref: dispatchID + "/a.txt"}},
				ArtifactsOmitted:        446,
				ArtifactsSkipped:        []lifecycle.SkippedArtifact{{Name: "b.txt", Reason: "over the listing cap"}},
				ArtifactsSkippedOmitted: 5453}},
		"needs_input": &lifecycle.NeedsInput{Common: common(0), QuestionID: lifecycle.QuestionID(dispatchID),
			Question: "Rewrite function A or B?", Options: []string{"A", "B"},
			Context: "Same signature, different call sites.", Kind: "decision",
			PartialState: json.RawMessage(`{"analysis":"A has 3 callers, B has 11"}`), DurationMS: 9000, ExitCode: 0},
		"needs_input by reference": &lifecycle.NeedsInput{Common: common(2), QuestionID: lifecycle.QuestionID(dispatchID),
			Question: "Which database?", PartialStateRef: dispatchID, DurationMS: 512, ExitCode: 3},
		"progress": &lifecycle.Progress{Common: common(0), Attempt: 1, Seq: 3, Message: "ran 12 of 40 tests", Percent: ptr(30.0),
			Todo: []lifecycle.ProgressTodo{{Text: "read the code", Done: true}, {Text: "fix the bug"}}, Lines: 5, Skipped: 1},
		"progress minimal":  &lifecycle.Progress{Common: common(1), Attempt: 2, Seq: 1, Lines: 1},
		"cancelled":         &lifecycle.Cancelled{Common: common(0), By: "alice@example.com", Reason: "wrong target"},
		"cancelled minimal": &lifecycle.Cancelled{Common: common(0), By: "router"},
		"answer": &lifecycle.Answer{QuestionID: lifecycle.QuestionID(dispatchID), Route: "approvals",
			Answer: "B", Decision: "approve", AnsweredBy: "alice@example.com", Comment: "B has fewer callers"},
		"answer minimal": &lifecycle.Answer{QuestionID: lifecycle.QuestionID(dispatchID), Answer: "yes",
			AnsweredBy: "agent:reviewer"},
	}
	for _, r := range lifecycle.Reasons() {
		f := &lifecycle.Failed{Common: common(0), Reason: r, Detail: "runtime: " + string(r), DurationMS: 300}
		if r == lifecycle.ReasonProviderFailed {
			f.ExitCode = intp(2)
		}
		d["failed "+string(r)] = f
	}
	for _, ev := range lifecycle.QuestionEvents() {
		d["question "+string(ev)] = question(ev)
	}
	return d
}

func TestGoldenEventsValidate(t *testing.T) {
	s := compile(t)
	kinds := map[string]bool{}
	for name, d := range goldenData() {
		t.Run(name, func(t *testing.T) {
			e, err := lifecycle.New(lifecycle.Source("test", "1"), d)
			if err != nil {
				t.Fatalf("lifecycle.New: %v", err)
			}
			file, err := lifecycle.SchemaName(e.Type())
			if err != nil {
				t.Fatal(err)
			}
			if got, want := e.DataSchema(), lifecycle.SchemaBase+file; got != want {
				t.Errorf("dataschema = %q, want %q", got, want)
			}
			if err := s.ValidateEvent(e.Type(), e.Data()); err != nil {
				t.Errorf("valid %s data refused: %v\ndata: %s", e.Type(), err, e.Data())
			}
		})
		e, _ := lifecycle.New(lifecycle.Source("test", "1"), d)
		kinds[e.Type()] = true
	}
	for _, typ := range lifecycle.Types() {
		if !kinds[typ] {
			t.Errorf("no golden data for %s", typ)
		}
	}
}

// data builds d's event and returns its data as a JSON object to mutate.
func data(t *testing.T, d lifecycle.Data) (string, map[string]any) {
	t.Helper()
	e, err := lifecycle.New(lifecycle.Source("test", "1"), d)
	if err != nil {
		t.Fatalf("lifecycle.New: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(e.Data(), &m); err != nil {
		t.Fatal(err)
	}
	return e.Type(), m
}

func TestSchemasBite(t *testing.T) {
	s := compile(t)
	golden := goldenData()
	tests := []struct {
		name   string
		data   string // key in goldenData
		mutate func(m map[string]any)
	}{
		{"missing dispatch_id", "finished", func(m map[string]any) { delete(m, "dispatch_id") }},
		{"missing thread_id", "started", func(m map[string]any) { delete(m, "thread_id") }},
		{"missing parent_id", "accepted", func(m map[string]any) { delete(m, "parent_id") }},
		{"dispatch_id with a dot", "failed timeout", func(m map[string]any) { m["dispatch_id"] = "01JD.3Q8" }},
		{"dispatch_id with a wildcard", "cancelled", func(m map[string]any) { m["dispatch_id"] = "a*" }},
		{"thread_id with a space", "needs_input", func(m map[string]any) { m["thread_id"] = "a b" }},
		{"empty subagent", "accepted", func(m map[string]any) { m["subagent"] = "" }},
		{"round as a string", "started", func(m map[string]any) { m["round"] = "1" }},
		{"round fractional", "started", func(m map[string]any) { m["round"] = 1.5 }},
		{"round negative", "finished", func(m map[string]any) { m["round"] = -1 }},
		{"bad reason", "failed timeout", func(m map[string]any) { m["reason"] = "oom" }},
		{"missing reason", "failed rejected", func(m map[string]any) { delete(m, "reason") }},
		{"exit_code as a string", "failed provider-failed", func(m map[string]any) { m["exit_code"] = "2" }},
		{"missing exit_code", "failed timeout", func(m map[string]any) { delete(m, "exit_code") }},
		{"finished non-zero exit", "finished", func(m map[string]any) { m["exit_code"] = 1 }},
		{"finished missing output", "finished", func(m map[string]any) { delete(m, "output") }},
		{"finished stderr_tail too long", "finished", func(m map[string]any) { m["stderr_tail"] = strings.Repeat("x", 4097) }},
		{"attempt zero", "started", func(m map[string]any) { m["attempt"] = 0 }},
		{"artifact without sha256", "finished with artifacts", func(m map[string]any) {
			delete(m["artifacts"].([]any)[0].(map[string]any), "sha256")
		}},
		{"artifact sha256 not hex", "finished with artifacts", func(m map[string]any) {
			m["artifacts"].([]any)[0].(map[string]any)["sha256"] = "not-a-digest"
		}},
		{"artifacts not a list", "finished with artifacts", func(m map[string]any) { m["artifacts"] = "a.txt" }},
		{"progress percent over 100", "progress", func(m map[string]any) { m["percent"] = 101 }},
		{"progress without seq", "progress", func(m map[string]any) { delete(m, "seq") }},
		{"progress todo without done", "progress", func(m map[string]any) {
			delete(m["todo"].([]any)[0].(map[string]any), "done")
		}},
		{"artifacts_omitted zero", "finished shrunk to fit", func(m map[string]any) { m["artifacts_omitted"] = 0 }},
		{"artifacts_skipped_omitted not a count", "finished shrunk to fit", func(m map[string]any) { m["artifacts_skipped_omitted"] = "many" }},
		{"output_dropped empty", "finished shrunk to fit", func(m map[string]any) { m["output_dropped"] = "" }},
		{"skipped artifact without reason", "finished with artifacts", func(m map[string]any) {
			delete(m["artifacts_skipped"].([]any)[0].(map[string]any), "reason")
		}},
		{"needs_input empty question", "needs_input", func(m map[string]any) { m["question"] = "" }},
		{"needs_input blank question", "needs_input", func(m map[string]any) { m["question"] = " \t" }},
		{"needs_input bad kind", "needs_input", func(m map[string]any) { m["kind"] = "opinion" }},
		{"needs_input state inline and by reference", "needs_input", func(m map[string]any) { m["partial_state_ref"] = "x" }},
		{"question bad event", "question asked", func(m map[string]any) { m["event"] = "pondered" }},
		{"question event does not match type", "question asked", func(m map[string]any) { m["event"] = "answered" }},
		{"question bad asked_at", "question asked", func(m map[string]any) { m["asked_at"] = "yesterday" }},
		{"question bad decision", "question answered", func(m map[string]any) { m["decision"] = "maybe" }},
		{"question route with a dot", "question asked", func(m map[string]any) { m["route"] = "a.b" }},
		{"request missing subagent", "request root", func(m map[string]any) { delete(m, "subagent") }},
		{"request input not an object", "request root", func(m map[string]any) { m["input"] = []any{"task"} }},
		{"request bad timeout", "request root", func(m map[string]any) { m["timeout"] = "soon" }},
		{"request env not strings", "request root", func(m map[string]any) { m["env"] = map[string]any{"N": 1} }},
		{"answer missing question_id", "answer", func(m map[string]any) { delete(m, "question_id") }},
		{"answer missing answered_by", "answer", func(m map[string]any) { delete(m, "answered_by") }},
		{"data not an object", "answer", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := golden[tt.data]
			if !ok {
				t.Fatalf("no golden data %q", tt.data)
			}
			typ, m := data(t, d)
			var b []byte
			if tt.mutate == nil {
				b = []byte(`"B"`)
			} else {
				tt.mutate(m)
				var err error
				if b, err = json.Marshal(m); err != nil {
					t.Fatal(err)
				}
			}
			err := s.ValidateEvent(typ, b)
			if err == nil {
				t.Errorf("%s: invalid data accepted: %s", typ, b)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// Events a producer emits may gain fields (consumers ignore them); a
// dispatch request may not: a misspelt field is refused rather than run
// with defaults.
func TestAdditionalPropertiesAllowed(t *testing.T) {
	s := compile(t)
	for name, d := range goldenData() {
		typ, m := data(t, d)
		m["x_future_field"] = map[string]any{"added": "later"}
		b, _ := json.Marshal(m)
		err := s.ValidateEvent(typ, b)
		switch {
		case typ == lifecycle.TypeRequested && err == nil:
			t.Errorf("%s: an unknown request field is accepted", name)
		case typ != lifecycle.TypeRequested && err != nil:
			t.Errorf("%s: an added field is refused: %v", name, err)
		}
	}
}

func TestValidateEventErrors(t *testing.T) {
	s := compile(t)
	err := s.ValidateEvent("dev.agora.dispatch.exploded", []byte(`{}`))
	if !errors.Is(err, lifecycle.ErrUnknownType) {
		t.Errorf("unknown type: err = %v, want ErrUnknownType", err)
	}
	if err := s.ValidateEvent(lifecycle.KindFinished.Type(), []byte(`{"dispatch_id":`)); err == nil {
		t.Error("truncated JSON accepted")
	}
	typ, m := data(t, goldenData()["failed timeout"])
	m["reason"] = "oom"
	b, _ := json.Marshal(m)
	var ve *jsonschema.ValidationError
	if err := s.ValidateEvent(typ, b); !errors.As(err, &ve) {
		t.Errorf("err = %v, want a *jsonschema.ValidationError", err)
	}
}

// TestTokenPatternMatchesValidToken keeps the id pattern in common.json in
// step with lifecycle.ValidToken.
func TestTokenPatternMatchesValidToken(t *testing.T) {
	s := compile(t)
	for _, tok := range []string{
		"01JD3Q8Z5X6Y7W8V9T0S1R2Q3P", "order-4711", "q-x", "a_b:c/d@e", "é", "日本",
		strings.Repeat("a", 256), strings.Repeat("a", 257), "",
		"a.b", "a*", "a>", "a b", "a\tb", "a\nb", "a\x00b", "a\x7fb", "a\u0085b",
		"a\u00a0b", "a\u2003b", "a\u2028b", "a\u3000b", "a\ufffdb", "a\u200bb", "a\ufeffb",
	} {
		b, _ := json.Marshal(map[string]any{"dispatch_id": tok, "thread_id": "t", "parent_id": "",
			"round": 0, "subagent": "s", "by": "me"})
		schemaOK := s.ValidateEvent(lifecycle.KindCancelled.Type(), b) == nil
		goOK := lifecycle.ValidToken(tok) == nil
		if schemaOK != goOK {
			t.Errorf("token %q: schema accepts = %v, lifecycle.ValidToken accepts = %v", tok, schemaOK, goOK)
		}
		// parent_id (optionalToken) is the same rule with "" allowed.
		b, _ = json.Marshal(map[string]any{"dispatch_id": "d", "thread_id": "t", "parent_id": tok,
			"round": 1, "subagent": "s", "by": "me"})
		schemaOK = s.ValidateEvent(lifecycle.KindCancelled.Type(), b) == nil
		if want := tok == "" || goOK; schemaOK != want {
			t.Errorf("parent_id %q: schema accepts = %v, want %v", tok, schemaOK, want)
		}
	}
}

// TestEveryTypeHasASchema fails when an event type lacks its schema file or
// a schema file describes no type.
func TestEveryTypeHasASchema(t *testing.T) {
	used := map[string]bool{schema.CommonName: true, schema.SentinelName: true}
	for _, typ := range lifecycle.Types() {
		name, err := lifecycle.SchemaName(typ)
		if err != nil {
			t.Errorf("%s: %v", typ, err)
			continue
		}
		used[name] = true
		if _, err := fs.Stat(schema.FS(), path.Join(schema.Dir, name)); err != nil {
			t.Errorf("%s: no schema file: %v", typ, err)
		}
	}
	for name := range schemaFiles(t) {
		if !used[name] {
			t.Errorf("%s/%s describes no event type", schema.Dir, name)
		}
	}
	s := compile(t)
	for _, typ := range lifecycle.Types() {
		if err := s.ValidateEvent(typ, []byte(`{}`)); err == nil || errors.Is(err, lifecycle.ErrUnknownType) {
			t.Errorf("%s: empty data: err = %v, want a validation error", typ, err)
		}
	}
}

// TestSentinelAgreesWithParser runs representative sentinel files through
// pkg/sentinel and through sentinel.json and wants the same verdict.
func TestSentinelAgreesWithParser(t *testing.T) {
	s := compile(t)
	tests := []struct {
		name    string
		content string
		valid   bool
	}{
		{"design example", `{"question": "Rewrite function A or B?", "options": ["A", "B"],
 "context": "Same signature, different call sites.",
 "kind": "decision", "partial_state": {"analysis": "…"}}`, true},
		{"minimal", `{"question":"A or B?"}`, true},
		{"approval", `{"question":"Deploy to production?","kind":"approval","partial_state":[1,2.50,"x"]}`, true},
		{"nulls mean absent", `{"question":"q","options":null,"context":null,"kind":null,"partial_state":null}`, true},
		{"empty options", `{"question":"q","options":[]}`, true},
		{"unknown fields ignored", `{"question":"q","confidence":0.4,"Kind":"opinion"}`, true},
		{"byte order mark", "\xef\xbb\xbf" + `{"question":"q"}`, true},
		{"dedupe key and reuse", `{"question":"q","dedupe_key":"loader name","reuse":false}`, true},
		{"dedupe key and reuse null", `{"question":"q","dedupe_key":null,"reuse":null}`, true},
		{"dedupe key blank", `{"question":"q","dedupe_key":" "}`, false},
		{"dedupe key control character", `{"question":"q","dedupe_key":"a\u0001b"}`, false},
		{"dedupe key not a string", `{"question":"q","dedupe_key":1}`, false},
		{"reuse not a boolean", `{"question":"q","reuse":"yes"}`, false},
		{"missing question", `{"options":["A","B"]}`, false},
		{"question key is case-sensitive", `{"Question":"q"}`, false},
		{"empty question", `{"question":""}`, false},
		{"blank question", `{"question":" \t\n "}`, false},
		{"unicode-blank question", `{"question":"\u00a0\u3000"}`, false},
		{"question not a string", `{"question":42}`, false},
		{"question null", `{"question":null}`, false},
		{"options not an array", `{"question":"q","options":"A,B"}`, false},
		{"option not a string", `{"question":"q","options":["A",2]}`, false},
		{"blank option", `{"question":"q","options":["A"," "]}`, false},
		{"context not a string", `{"question":"q","context":{}}`, false},
		{"kind unknown", `{"question":"q","kind":"opinion"}`, false},
		{"kind empty", `{"question":"q","kind":""}`, false},
		{"not an object", `["question"]`, false},
		{"trailing data", `{"question":"q"} {}`, false},
		{"empty file", ``, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, perr := sentinel.Parse([]byte(tt.content))
			if (perr == nil) != tt.valid {
				t.Fatalf("sentinel.Parse: err = %v, want valid = %v (fix the case)", perr, tt.valid)
			}
			serr := s.ValidateSentinel([]byte(tt.content))
			if (serr == nil) != tt.valid {
				t.Errorf("ValidateSentinel: err = %v, want valid = %v (sentinel.Parse: %v)", serr, tt.valid, perr)
			}
		})
	}
}

// schemaFiles reads every file of the embedded schema directory, by name.
func schemaFiles(t *testing.T) map[string][]byte {
	t.Helper()
	entries, err := fs.ReadDir(schema.FS(), schema.Dir)
	if err != nil {
		t.Fatal(err)
	}
	files := make(map[string][]byte, len(entries))
	for _, e := range entries {
		if files[e.Name()], err = fs.ReadFile(schema.FS(), path.Join(schema.Dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func TestSchemaIDs(t *testing.T) {
	for name, b := range schemaFiles(t) {
		var doc struct {
			Schema string `json:"$schema"`
			ID     string `json:"$id"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if doc.ID != lifecycle.SchemaBase+name {
			t.Errorf("%s: $id = %q, want %q", name, doc.ID, lifecycle.SchemaBase+name)
		}
		if doc.Schema != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: $schema = %q, want draft 2020-12", name, doc.Schema)
		}
	}
}

func TestSetIsSafeForConcurrentUse(t *testing.T) {
	s := compile(t)
	golden := goldenData()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for name, d := range golden {
				e, err := lifecycle.New(lifecycle.Source("test", "1"), d)
				if err != nil {
					t.Error(err)
					return
				}
				if err := s.ValidateEvent(e.Type(), e.Data()); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				if err := s.ValidateSentinel([]byte(`{"question":"q"}`)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
}

func ptr[T any](v T) *T { return &v }
