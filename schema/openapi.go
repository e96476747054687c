package schema

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"sync"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// OpenAPIName is the OpenAPI 3.1 document of the HTTP API inside [FS], as
// written; [OpenAPI] returns it bundled.
const OpenAPIName = "openapi/agora.json"

// OpenAPI returns the HTTP API's OpenAPI 3.1 document, self-contained: the
// event schemas it refers to (the dispatch request, …) are copied into
// components/schemas under their file names without ".json", their
// references rewritten to point inside the document, and Round is built
// from Record (docs/dispatcher.md, "The HTTP contract").
var OpenAPI = sync.OnceValues(bundleOpenAPI)

func bundleOpenAPI() ([]byte, error) {
	raw, err := fs.ReadFile(files, OpenAPIName)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("schema: %s: %w", OpenAPIName, err)
	}
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	names, err := fs.Glob(files, Dir+"/*.json")
	if err != nil {
		return nil, err
	}
	for _, p := range names {
		file := path.Base(p)
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return nil, err
		}
		var s map[string]any
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("schema: %s: %w", file, err)
		}
		delete(s, "$schema")
		delete(s, "$id")
		name := strings.TrimSuffix(file, ".json")
		schemas[name] = rewriteRefs(s, name)
	}
	// Round is a Record whose events are the round's CloudEvents.
	rec := schemas["Record"].(map[string]any)
	round := map[string]any{}
	for k, v := range rec {
		round[k] = v
	}
	props := map[string]any{}
	for k, v := range rec["properties"].(map[string]any) {
		props[k] = v
	}
	props["events"] = map[string]any{"type": "array", "items": map[string]any{"$ref": "#/components/schemas/CloudEvent"}}
	round["properties"] = props
	round["description"] = "One round of a thread: its record, with the round's lifecycle CloudEvents as events."
	schemas["Round"] = round
	return json.MarshalIndent(doc, "", " ")
}

// rewriteRefs points the references of schema name (its own #/$defs/…,
// and other files by their $id) inside the bundled document.
func rewriteRefs(v any, name string) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "$ref" {
				x[k] = bundledRef(s, name)
				continue
			}
			x[k] = rewriteRefs(e, name)
		}
	case []any:
		for i, e := range x {
			x[i] = rewriteRefs(e, name)
		}
	}
	return v
}

func bundledRef(ref, self string) string {
	if frag, ok := strings.CutPrefix(ref, "#"); ok {
		return "#/components/schemas/" + self + frag
	}
	if rest, ok := strings.CutPrefix(ref, lifecycle.SchemaBase); ok {
		file, frag, _ := strings.Cut(rest, "#")
		return "#/components/schemas/" + strings.TrimSuffix(file, ".json") + frag
	}
	return ref
}
