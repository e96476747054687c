package dispatcher_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/schema"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// The HTTP API's OpenAPI document is checked against the real handlers:
// every exchange of this package's HTTP tests (harness.do) is validated
// against the operation it matches — the status must be documented, and
// the JSON bodies must match their schemas — so a handler that drifts from
// the document fails the tests that exercise it (docs/dispatcher.md).

const openapiURL = "https://agora.invalid/openapi.json"

type contract struct {
	doc map[string]any
	c   *jsonschema.Compiler
	mu  sync.Mutex
	sch map[string]*jsonschema.Schema
	ops []operation
}

type operation struct {
	method, template string
	re               *regexp.Regexp
	op               map[string]any
}

var loadContract = sync.OnceValues(func() (*contract, error) {
	b, err := schema.OpenAPI()
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(openapiURL, doc); err != nil {
		return nil, err
	}
	k := &contract{doc: doc.(map[string]any), c: c, sch: map[string]*jsonschema.Schema{}}
	for tmpl, item := range k.doc["paths"].(map[string]any) {
		var segs []string
		for _, seg := range strings.Split(tmpl, "/") {
			switch {
			case seg == "{name}":
				segs = append(segs, ".+") // an artifact path may hold slashes
			case strings.HasPrefix(seg, "{"):
				segs = append(segs, "[^/]+")
			default:
				segs = append(segs, regexp.QuoteMeta(seg))
			}
		}
		re := regexp.MustCompile("^" + strings.Join(segs, "/") + "$")
		for method, op := range item.(map[string]any) {
			k.ops = append(k.ops, operation{method: strings.ToUpper(method), template: tmpl, re: re, op: op.(map[string]any)})
		}
	}
	// Longer templates first, so /v1/dispatches/{id}/cancel wins over
	// /v1/dispatches/{id}.
	sort.Slice(k.ops, func(i, j int) bool { return len(k.ops[i].template) > len(k.ops[j].template) })
	return k, nil
})

func pointer(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString("/" + strings.ReplaceAll(strings.ReplaceAll(p, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

func (k *contract) schema(ptr string) (*jsonschema.Schema, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if s, ok := k.sch[ptr]; ok {
		return s, nil
	}
	s, err := k.c.Compile(openapiURL + "#" + ptr)
	if err != nil {
		return nil, err
	}
	k.sch[ptr] = s
	return s, nil
}

func (k *contract) find(method, path string) (operation, bool) {
	for _, o := range k.ops {
		if o.method == method && o.re.MatchString(path) {
			return o, true
		}
	}
	return operation{}, false
}

// check validates one exchange; it returns what does not match.
func (k *contract) check(method, path string, reqBody []byte, reqType string, status int, respType string, respBody []byte) error {
	o, ok := k.find(method, path)
	if !ok {
		return fmt.Errorf("%s %s is not in the OpenAPI document", method, path)
	}
	responses := o.op["responses"].(map[string]any)
	code := strconv.Itoa(status)
	resp, ok := responses[code].(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s answered %d, which the document does not list for %s %s", method, path, status, o.method, o.template)
	}
	if status < 300 && len(reqBody) > 0 && strings.HasPrefix(reqType, "application/json") {
		if rb, ok := o.op["requestBody"].(map[string]any); ok {
			if err := k.validate(pointer("paths", o.template, strings.ToLower(o.method), "requestBody", "content", "application/json", "schema"), reqBody); err != nil {
				return fmt.Errorf("%s %s request body: %w", method, path, err)
			}
			_ = rb
		}
	}
	mt, _, _ := mime.ParseMediaType(respType)
	content, _ := resp["content"].(map[string]any)
	if len(content) == 0 {
		return nil
	}
	if _, ok := content[mt]; !ok {
		if _, any := content["*/*"]; any {
			return nil
		}
		return fmt.Errorf("%s %s %d: content type %q is not documented", method, path, status, respType)
	}
	if mt == "application/json" || mt == "application/problem+json" {
		return k.validate(pointer("paths", o.template, strings.ToLower(o.method), "responses", code, "content", mt, "schema"), respBody)
	}
	return nil
}

func (k *contract) validate(ptr string, body []byte) error {
	s, err := k.schema(ptr)
	if err != nil {
		return fmt.Errorf("compile %s: %w", ptr, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(v)
}

// checkExchange is called by harness.do for every request it makes.
func checkExchange(t *testing.T, req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) {
	t.Helper()
	if !strings.HasPrefix(req.URL.Path, "/v1/") {
		return
	}
	k, err := loadContract()
	if err != nil {
		t.Fatalf("OpenAPI document: %v", err)
	}
	if err := k.check(req.Method, req.URL.Path, reqBody, req.Header.Get("Content-Type"), resp.StatusCode, resp.Header.Get("Content-Type"), respBody); err != nil {
		t.Errorf("contract: %v\nresponse: %.600s", err, respBody)
	}
}

// The document is a valid OpenAPI 3.1 document (the specification's own
// schema, schema/openapi/oas-3.1-schema.json) and is served.
func TestOpenAPIDocumentIsValid(t *testing.T) {
	b, err := schema.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile("../../schema/openapi/oas-3.1-schema.json")
	if err != nil {
		t.Fatal(err)
	}
	mv, _ := jsonschema.UnmarshalJSON(bytes.NewReader(meta))
	c := jsonschema.NewCompiler()
	if err := c.AddResource("https://spec.openapis.org/oas/3.1/schema", mv); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("https://spec.openapis.org/oas/3.1/schema")
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err := s.Validate(doc); err != nil {
		t.Errorf("not a valid OpenAPI 3.1 document: %v", err)
	}
	// Every schema in it compiles (no dangling reference).
	k, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	for name := range k.doc["components"].(map[string]any)["schemas"].(map[string]any) {
		if _, err := k.schema(pointer("components", "schemas", name)); err != nil {
			t.Errorf("schema %s: %v", name, err)
		}
	}

	h := newHarness(t, dispatcher.Config{APITokens: []string{"tok"}})
	resp, body := h.do(http.MethodGet, "/v1/openapi.json", "", "")
	// The served document is the bundle with info.version set to the build's.
	var served, bundled map[string]any
	if err := json.Unmarshal(body, &served); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &bundled); err != nil {
		t.Fatal(err)
	}
	if info, ok := bundled["info"].(map[string]any); ok {
		info["version"] = served["info"].(map[string]any)["version"]
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" || !reflect.DeepEqual(served, bundled) {
		t.Errorf("GET /v1/openapi.json: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// Every /v1 route the handler registers is documented, and every
// documented /v1 operation is registered.
func TestOpenAPICoversEveryRoute(t *testing.T) {
	src, err := os.ReadFile("http.go")
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	for _, m := range regexp.MustCompile(`mux\.Handle(?:Func)?\("(GET|POST|PUT|DELETE|PATCH) (/v1/[^"]*)"`).FindAllStringSubmatch(string(src), -1) {
		registered[m[1]+" "+strings.ReplaceAll(m[2], "{name...}", "{name}")] = true
	}
	if len(registered) < 10 {
		t.Fatalf("found %d /v1 routes in http.go; the pattern no longer matches the registration", len(registered))
	}
	k, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, o := range k.ops {
		// The inbox's operations are held to the inbox elsewhere
		// (docs/api.md).
		if strings.HasPrefix(o.template, "/v1/") {
			documented[o.method+" "+o.template] = true
		}
	}
	testkit.SameRoutes(t, registered, documented)
}

// Every documented operation answers as documented (harness.do checks
// each exchange against the document).
func TestOpenAPIOperationsAnswer(t *testing.T) {
	h := newHarness(t, dispatcher.Config{APITokens: []string{"tok"}})
	const tok = "tok"
	resp, body := h.do(http.MethodPost, "/v1/dispatches", `{"dispatch_id":"oas-1","subagent":"planner","input":{"x":1},"labels":{"team":"core"}}`, tok, "Content-Type", "application/json")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("dispatch: %d %s", resp.StatusCode, body)
	}
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{http.MethodPost, "/v1/dispatches", `{"dispatch_id":"oas-1","subagent":"planner","input":{"x":1},"labels":{"team":"core"}}`, http.StatusOK},
		{http.MethodPost, "/v1/dispatches", `{"dispatch_id":"oas-1","subagent":"planner","input":{"x":2}}`, http.StatusConflict},
		{http.MethodPost, "/v1/dispatches", `{"subagent":"planner","inptu":{}}`, http.StatusUnprocessableEntity},
		{http.MethodPost, "/v1/dispatches", `{"subagent":"planner"}`, http.StatusUnauthorized},
		{http.MethodGet, "/v1/dispatches/oas-1", "", http.StatusOK},
		{http.MethodGet, "/v1/dispatches/nope", "", http.StatusNotFound},
		{http.MethodGet, "/v1/threads/oas-1", "", http.StatusOK},
		{http.MethodGet, "/v1/threads/nope", "", http.StatusNotFound},
		{http.MethodGet, "/v1/dispatches/oas-1/artifacts", "", http.StatusConflict},
		{http.MethodGet, "/v1/dispatches/oas-1/artifacts/report.md", "", http.StatusConflict},
		{http.MethodGet, "/v1/schemas/dispatch.requested.json", "", http.StatusOK},
		{http.MethodGet, "/v1/schemas/nope.json", "", http.StatusNotFound},
		{http.MethodGet, "/v1/openapi.json", "", http.StatusOK},
		{http.MethodPost, "/v1/dispatches/oas-1/cancel", `{"by":"alice","reason":"done"}`, http.StatusOK},
		{http.MethodPost, "/v1/threads/oas-1/cancel", `{"by":"alice"}`, http.StatusOK},
		{http.MethodPost, "/v1/dispatches/oas-1/cancel", `{"by":"alice","reasn":"x"}`, http.StatusUnprocessableEntity},
	} {
		token := tok
		if c.want == http.StatusUnauthorized {
			token = "wrong"
		}
		resp, body := h.do(c.method, c.path, c.body, token, "Content-Type", "application/json")
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, resp.StatusCode, body, c.want)
		}
	}
	// The unknown field is named.
	_, body = h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"planner","inptu":{}}`, tok, "Content-Type", "application/json")
	if !strings.Contains(string(body), `"field":"inptu"`) {
		t.Errorf("a misspelt field is not named: %s", body)
	}
	// The event stream answers with text/event-stream.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, h.http.URL+"/v1/events?thread=oas-1", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	cl := &http.Client{Timeout: 2 * time.Second}
	r, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := loadContract()
	if err := k.check(http.MethodGet, "/v1/events", nil, "", r.StatusCode, r.Header.Get("Content-Type"), nil); err != nil {
		t.Error(err)
	}
	r.Body.Close()
	_ = lifecycle.KindAccepted
}
