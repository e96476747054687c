package schema_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/agora-dispatch/agora/schema"
)

// openapiFile is the repository file, read from disk as a program would.
const openapiFile = "openapi/agora.json"

// The repository file stands on its own: every reference is
// #/components/schemas/<name> of a component it holds (no nested $defs,
// no other file), a generic OpenAPI loader resolves it with external
// references refused, and it is what OpenAPI serves.
func TestOpenAPIFileStandsAlone(t *testing.T) {
	raw, err := os.ReadFile(openapiFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	schemas, _ := doc["components"].(map[string]any)["schemas"].(map[string]any)
	form := regexp.MustCompile(`^#/components/schemas/([A-Za-z0-9._-]+)$`)
	var refs int
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch x := v.(type) {
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(x)) {
				if k == "$defs" {
					t.Errorf("%s/$defs: nested definitions; flatten them into components", at)
				}
				if s, ok := x[k].(string); ok && (k == "$ref" || k == "$dynamicRef") {
					refs++
					m := form.FindStringSubmatch(s)
					switch {
					case m == nil || k != "$ref":
						t.Errorf("%s: %s %q is not of the form #/components/schemas/<name>", at, k, s)
					case schemas[m[1]] == nil:
						t.Errorf("%s: $ref %q names no component", at, s)
					}
					continue
				}
				walk(x[k], at+"/"+k)
			}
		case []any:
			for _, e := range x {
				walk(e, at+"/…")
			}
		}
	}
	walk(doc, "#")
	if refs < 50 {
		t.Errorf("found %d references; the walk no longer sees them", refs)
	}

	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = false
	d, err := loader.LoadFromFile(openapiFile)
	if err != nil {
		t.Fatalf("%s does not load on its own: %v", openapiFile, err)
	}
	if err := d.Validate(loader.Context); err != nil {
		t.Errorf("%s: %v", openapiFile, err)
	}

	served, err := schema.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(served, raw) {
		t.Error("schema.OpenAPI is not the repository file")
	}
}

// The document describes every operation a program uses: dispatching and
// following work over the dispatcher's /v1 API, and listing and answering
// questions over the inbox's JSON API and answer links (docs/api.md).
func TestOpenAPIDescribesWhatProgramsUse(t *testing.T) {
	b, err := schema.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	have := map[string]string{}
	for p, item := range doc.Paths {
		for method, op := range item {
			have[op.OperationID] = method + " " + p
		}
	}
	for id, want := range map[string]string{
		"dispatch":          "post /v1/dispatches",
		"getDispatch":       "get /v1/dispatches/{id}",
		"getThread":         "get /v1/threads/{id}",
		"events":            "get /v1/events",
		"cancelDispatch":    "post /v1/dispatches/{id}/cancel",
		"cancelThread":      "post /v1/threads/{id}/cancel",
		"listArtifacts":     "get /v1/dispatches/{id}/artifacts",
		"getArtifact":       "get /v1/dispatches/{id}/artifacts/{name}",
		"listQuestions":     "get /inbox/api/questions",
		"getQuestion":       "get /inbox/api/questions/{id}",
		"answerQuestion":    "post /inbox/api/questions/{id}/answer",
		"createAnswerLinks": "post /inbox/api/questions/{id}/links",
		"reverseSuggestion": "post /inbox/api/questions/{id}/reverse",
		"getAnswerLink":     "get /inbox/a/{token}",
		"useAnswerLink":     "post /inbox/a/{token}",
		"login":             "post /inbox/api/login",
	} {
		if have[id] != want {
			t.Errorf("operation %s: %q, want %q", id, have[id], want)
		}
	}
}
