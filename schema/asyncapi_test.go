package schema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/schema"
)

// officialSchema is the official AsyncAPI 3.0.0 JSON Schema (bundled: every
// definition is inside the file under its own $id).
const officialSchema = "asyncapi/asyncapi-3.0.0.schema.json"

// docURL is where asyncapi.yaml lives next to cloudevents/, so that its
// relative payload references resolve to the schemas' $ids.
var docURL = strings.TrimSuffix(lifecycle.SchemaBase, schema.Dir+"/") + schema.AsyncAPIName

// asyncAPIDoc returns asyncapi.yaml as JSON.
func asyncAPIDoc(t *testing.T) []byte {
	t.Helper()
	y, err := fs.ReadFile(schema.FS(), schema.AsyncAPIName)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatalf("%s: %v", schema.AsyncAPIName, err)
	}
	return j
}

func decode(t *testing.T, j []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// asyncAPISchema compiles the official AsyncAPI 3.0.0 JSON Schema. Its
// references are to its own definitions and to the draft-07 metaschema,
// which jsonschema/v6 ships; nothing is fetched.
func asyncAPISchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	b, err := os.ReadFile(officialSchema)
	if err != nil {
		t.Fatalf("the official AsyncAPI schema is missing: %v", err)
	}
	doc := decode(t, b)
	id, _ := doc.(map[string]any)["$id"].(string)
	if id == "" {
		t.Fatalf("%s: no $id", officialSchema)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	c.UseLoader(offline{})
	if err := c.AddResource(id, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(id)
	if err != nil {
		t.Fatalf("compile %s: %v", officialSchema, err)
	}
	return sch
}

// offline refuses every URL the compiler does not already hold, so a
// reference outside the official file fails the test instead of reaching
// the network or the file system.
type offline struct{}

func (offline) Load(url string) (any, error) {
	return nil, fmt.Errorf("offline: %s is neither in the schema file nor built into jsonschema/v6", url)
}

func TestAsyncAPIDocumentIsValid(t *testing.T) {
	sch := asyncAPISchema(t)
	if err := sch.Validate(decode(t, asyncAPIDoc(t))); err != nil {
		t.Fatalf("%s is not a valid AsyncAPI 3.0.0 document:\n%v", schema.AsyncAPIName, err)
	}
}

// TestAsyncAPIValidationBites proves that the official schema refuses
// broken copies of the document, so TestAsyncAPIDocumentIsValid can fail.
func TestAsyncAPIValidationBites(t *testing.T) {
	sch := asyncAPISchema(t)
	tests := []struct {
		name   string
		mutate func(doc map[string]any)
	}{
		{"no info", func(doc map[string]any) { delete(doc, "info") }},
		{"version 2.6.0", func(doc map[string]any) { doc["asyncapi"] = "2.6.0" }},
		{"AsyncAPI 2 publish action", func(doc map[string]any) {
			op := doc["operations"].(map[string]any)["clientSendRequest"].(map[string]any)
			op["action"] = "publish"
		}},
		{"operation without channel", func(doc map[string]any) {
			delete(doc["operations"].(map[string]any)["workerReceiveWork"].(map[string]any), "channel")
		}},
		{"channel address not a string", func(doc map[string]any) {
			doc["channels"].(map[string]any)["lifecycle"].(map[string]any)["address"] = 42
		}},
		{"parameter with a schema (AsyncAPI 2 style)", func(doc map[string]any) {
			p := doc["components"].(map[string]any)["parameters"].(map[string]any)["subagent"].(map[string]any)
			p["schema"] = map[string]any{"type": "string"}
		}},
		{"unknown top-level field", func(doc map[string]any) { doc["topics"] = map[string]any{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var doc map[string]any
			if err := json.Unmarshal(asyncAPIDoc(t), &doc); err != nil {
				t.Fatal(err)
			}
			tt.mutate(doc)
			b, _ := json.Marshal(doc)
			if err := sch.Validate(decode(t, b)); err == nil {
				t.Error("broken document accepted")
			}
		})
	}
}

// document is the part of asyncapi.yaml the consistency tests read.
type document struct {
	Channels map[string]struct {
		Address    *string                    `json:"address"`
		Parameters map[string]json.RawMessage `json:"parameters"`
		Messages   map[string]messageRef      `json:"messages"`
		JetStream  *struct {
			Stream string `json:"stream"`
		} `json:"x-jetstream"`
	} `json:"channels"`
	Operations map[string]struct {
		Action   string `json:"action"`
		Consumer *struct {
			Durable string `json:"durable"`
			Filter  string `json:"filter"`
		} `json:"x-jetstream-consumer"`
	} `json:"operations"`
	Components struct {
		Parameters map[string]parameter `json:"parameters"`
		Messages   map[string]struct {
			Headers struct {
				AllOf []struct {
					Properties map[string]struct {
						Const string `json:"const"`
					} `json:"properties"`
				} `json:"allOf"`
			} `json:"headers"`
			Payload struct {
				Ref string `json:"$ref"`
			} `json:"payload"`
		} `json:"messages"`
	} `json:"components"`
}

type messageRef struct {
	Ref string `json:"$ref"`
}

type parameter struct {
	Ref  string   `json:"$ref"`
	Enum []string `json:"enum"`
}

func parseDocument(t *testing.T) document {
	t.Helper()
	var d document
	if err := json.Unmarshal(asyncAPIDoc(t), &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// param resolves a channel parameter, following a reference into
// components/parameters.
func (d document) param(t *testing.T, raw json.RawMessage) parameter {
	t.Helper()
	var p parameter
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	if p.Ref != "" {
		name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/")
		if !ok {
			t.Fatalf("parameter reference %q", p.Ref)
		}
		p, ok = d.Components.Parameters[name]
		if !ok {
			t.Fatalf("parameter reference %q: no such parameter", p.Ref)
		}
	}
	return p
}

var placeholder = regexp.MustCompile(`\{([^{}]+)\}`)

// templateRE turns a channel address into a regexp with one named group
// per parameter, each matching one subject token.
func templateRE(address string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	last := 0
	for _, m := range placeholder.FindAllStringSubmatchIndex(address, -1) {
		b.WriteString(regexp.QuoteMeta(address[last:m[0]]))
		b.WriteString("(?P<" + address[m[2]:m[3]] + `>[^.*>\s]+)`)
		last = m[1]
	}
	b.WriteString(regexp.QuoteMeta(address[last:]) + "$")
	return regexp.MustCompile(b.String())
}

// TestAsyncAPIChannelsMatchBuilders checks every channel address against
// the subject builders of pkg/lifecycle: each built subject matches its
// channel's template and yields the values it was built from, every
// channel has a builder, and the parameter enums are the closed sets.
func TestAsyncAPIChannelsMatchBuilders(t *testing.T) {
	doc := parseDocument(t)
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	type built struct {
		subject string
		params  map[string]string
	}
	cases := map[string][]built{
		"requests": {{must(lifecycle.RequestSubject("planner")), map[string]string{"subagent": "planner"}}},
		"dispatch": {{must(lifecycle.DispatchSubject("data-sync")), map[string]string{"subagent": "data-sync"}}},
		"answers": {{must(lifecycle.AnswerSubject("approvals", "q-"+dispatchID)),
			map[string]string{"route": "approvals", "question_id": "q-" + dispatchID}}},
		"cancel": {{must(lifecycle.CancelSubject(dispatchID)), map[string]string{"dispatch_id": dispatchID}}},
		"progress": {{must(lifecycle.ProgressSubject(threadID, dispatchID)),
			map[string]string{"thread_id": threadID, "dispatch_id": dispatchID}}},
		"apiDispatch":       {{lifecycle.APIDispatch, nil}},
		"apiCancel":         {{lifecycle.APICancel, nil}},
		"apiStatus":         {{lifecycle.APIStatus, nil}},
		"apiAnswer":         {{lifecycle.APIAnswer, nil}},
		"apiDispatchCaller": {{must(lifecycle.APICaller(lifecycle.APIDispatch, "answerer-agents")), map[string]string{"user": "answerer-agents"}}},
		"apiCancelCaller":   {{must(lifecycle.APICaller(lifecycle.APICancel, "answerer-agents")), map[string]string{"user": "answerer-agents"}}},
		"apiStatusCaller":   {{must(lifecycle.APICaller(lifecycle.APIStatus, "answerer-agents")), map[string]string{"user": "answerer-agents"}}},
		"apiAnswerRoute":    {{must(lifecycle.APIAnswerRoute("human")), map[string]string{"route": "human"}}},
	}
	for _, k := range lifecycle.Kinds() {
		cases["lifecycle"] = append(cases["lifecycle"], built{must(lifecycle.LifecycleSubject(k, threadID, dispatchID)),
			map[string]string{"kind": string(k), "thread_id": threadID, "dispatch_id": dispatchID}})
	}
	for _, ev := range lifecycle.QuestionEvents() {
		cases["questions"] = append(cases["questions"], built{must(lifecycle.QuestionSubject("default", "q-"+dispatchID, ev)),
			map[string]string{"route": "default", "question_id": "q-" + dispatchID, "event": string(ev)}})
	}

	for name, ch := range doc.Channels {
		if ch.Address == nil {
			continue // a reply inbox: dynamic
		}
		var names []string
		for _, m := range placeholder.FindAllStringSubmatch(*ch.Address, -1) {
			names = append(names, m[1])
			if _, ok := ch.Parameters[m[1]]; !ok {
				t.Errorf("channel %s: {%s} has no parameter", name, m[1])
			}
		}
		for p := range ch.Parameters {
			if !slices.Contains(names, p) {
				t.Errorf("channel %s: parameter %s is not in the address %q", name, p, *ch.Address)
			}
		}
		builds, ok := cases[name]
		if !ok {
			t.Errorf("channel %s (%s) has no builder in pkg/lifecycle covered by this test", name, *ch.Address)
			continue
		}
		re := templateRE(*ch.Address)
		for _, b := range builds {
			m := re.FindStringSubmatch(b.subject)
			if m == nil {
				t.Errorf("channel %s: built subject %q does not match %q", name, b.subject, *ch.Address)
				continue
			}
			for i, g := range re.SubexpNames()[1:] {
				if m[i+1] != b.params[g] {
					t.Errorf("channel %s: %q: {%s} = %q, want %q", name, b.subject, g, m[i+1], b.params[g])
				}
			}
		}
	}
	for name := range cases {
		if _, ok := doc.Channels[name]; !ok {
			t.Errorf("no channel %s in %s", name, schema.AsyncAPIName)
		}
	}

	var kinds, events []string
	for _, k := range lifecycle.Kinds() {
		kinds = append(kinds, string(k))
	}
	for _, ev := range lifecycle.QuestionEvents() {
		events = append(events, string(ev))
	}
	if got := doc.param(t, doc.Channels["lifecycle"].Parameters["kind"]).Enum; !slices.Equal(got, kinds) {
		t.Errorf("lifecycle {kind} enum = %v, want %v", got, kinds)
	}
	if got := doc.param(t, doc.Channels["questions"].Parameters["event"]).Enum; !slices.Equal(got, events) {
		t.Errorf("questions {event} enum = %v, want %v", got, events)
	}
}

// TestAsyncAPIJetStreamNames checks the streams and durable consumers the
// document names against pkg/lifecycle's constants.
func TestAsyncAPIJetStreamNames(t *testing.T) {
	doc := parseDocument(t)
	streams := map[string]string{
		"requests":  lifecycle.StreamRequests,
		"dispatch":  lifecycle.StreamDispatch,
		"lifecycle": lifecycle.StreamLifecycle,
		"questions": lifecycle.StreamQuestions,
		"answers":   lifecycle.StreamAnswers,
		"progress":  lifecycle.StreamProgress,
	}
	for name, ch := range doc.Channels {
		got := ""
		if ch.JetStream != nil {
			got = ch.JetStream.Stream
		}
		if got != streams[name] {
			t.Errorf("channel %s: stream %q, want %q", name, got, streams[name])
		}
	}
	consumers := map[string][2]string{
		"dispatcherReceiveRequests": {lifecycle.ConsumerDispatcher, lifecycle.SubjectRequestsAll},
		"workerReceiveWork":         {lifecycle.ConsumerWorkers, lifecycle.SubjectDispatchAll},
	}
	for name, want := range consumers {
		op, ok := doc.Operations[name]
		if !ok || op.Consumer == nil {
			t.Errorf("operation %s: no x-jetstream-consumer", name)
			continue
		}
		if got := [2]string{op.Consumer.Durable, op.Consumer.Filter}; got != want {
			t.Errorf("operation %s: consumer %v, want %v", name, got, want)
		}
	}
}

// messageFor returns the component message whose ce-type header is typ.
func (d document) messageFor(typ string) (name string, payload, dataschema string) {
	for n, m := range d.Components.Messages {
		for _, s := range m.Headers.AllOf {
			if s.Properties["ce-type"].Const == typ {
				return n, m.Payload.Ref, s.Properties["ce-dataschema"].Const
			}
		}
	}
	return "", "", ""
}

// TestAsyncAPIMessagesCoverTypes checks that every event type has a message
// whose payload is the type's schema file.
func TestAsyncAPIMessagesCoverTypes(t *testing.T) {
	doc := parseDocument(t)
	for _, typ := range lifecycle.Types() {
		file, err := lifecycle.SchemaName(typ)
		if err != nil {
			t.Fatal(err)
		}
		name, payload, dataschema := doc.messageFor(typ)
		if name == "" {
			t.Errorf("%s: no message with ce-type %s", typ, typ)
			continue
		}
		if want := "./" + path.Join(schema.Dir, file); payload != want {
			t.Errorf("%s: message %s: payload %q, want %q", typ, name, payload, want)
		}
		if want := lifecycle.SchemaBase + file; dataschema != want {
			t.Errorf("%s: message %s: ce-dataschema %q, want %q", typ, name, dataschema, want)
		}
	}
}

// messageCompiler compiles parts of asyncapi.yaml as JSON Schema (draft-07,
// the base of the AsyncAPI Schema Object), with the cloudevents schemas as
// resources so the payload references resolve offline.
func messageCompiler(t *testing.T) *jsonschema.Compiler {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.AssertFormat()
	c.UseLoader(offline{})
	for name, b := range schemaFiles(t) {
		if err := c.AddResource(lifecycle.SchemaBase+name, decode(t, b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.AddResource(docURL, decode(t, asyncAPIDoc(t))); err != nil {
		t.Fatal(err)
	}
	return c
}

func headerValues(h nats.Header) map[string]any {
	m := map[string]any{}
	for k, v := range h {
		if len(v) > 0 {
			m[k] = v[0]
		}
	}
	return m
}

// TestAsyncAPIDescribesEncodedMessages encodes every golden event with
// lifecycle.New, Subject and Encode and checks that the document describes the result: the
// subject matches a channel carrying a message of the event's type, the
// headers lifecycle.Encode writes satisfy that message's header schema, and
// the data satisfies its payload (reached through the document's relative
// $ref).
func TestAsyncAPIDescribesEncodedMessages(t *testing.T) {
	doc := parseDocument(t)
	c := messageCompiler(t)
	for name, d := range goldenData() {
		t.Run(name, func(t *testing.T) {
			e, err := lifecycle.New(lifecycle.Source("worker", "worker-7c9f"), d,
				lifecycle.WithTraceparent(lifecycle.NewTraceparent()))
			if err != nil {
				t.Fatal(err)
			}
			subject, err := lifecycle.Subject(d)
			if a, ok := d.(*lifecycle.Answer); ok && a.Route == "" {
				// An answer without a route goes through the router's endpoint.
				subject, err = lifecycle.APIAnswer, nil
			}
			if err != nil {
				t.Fatal(err)
			}
			msg, err := lifecycle.Encode(subject, e)
			if err != nil {
				t.Fatal(err)
			}
			mname, _, _ := doc.messageFor(e.Type())
			if mname == "" {
				t.Fatalf("no message for %s", e.Type())
			}
			matched := 0
			for cname, ch := range doc.Channels {
				if ch.Address == nil || !templateRE(*ch.Address).MatchString(msg.Subject) {
					continue
				}
				matched++
				if !slices.ContainsFunc(slices.Collect(maps.Values(ch.Messages)), func(m messageRef) bool {
					return m.Ref == "#/components/messages/"+mname
				}) {
					t.Errorf("subject %s matches channel %s, which has no message %s", msg.Subject, cname, mname)
				}
			}
			if matched != 1 {
				t.Errorf("subject %s matches %d channels, want 1", msg.Subject, matched)
			}
			for part, v := range map[string]any{
				"headers": headerValues(msg.Header),
				"payload": decode(t, msg.Data),
			} {
				sch, err := c.Compile(docURL + "#/components/messages/" + mname + "/" + part)
				if err != nil {
					t.Fatalf("compile %s %s: %v", mname, part, err)
				}
				if err := sch.Validate(v); err != nil {
					t.Errorf("%s %s: %v", mname, part, err)
				}
			}
		})
	}
}
