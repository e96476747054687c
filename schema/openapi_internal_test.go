package schema

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

var update = flag.Bool("update", false, "rewrite openapi/agora.json with its copies of the event schemas made anew (go generate ./schema)")

// The event schemas in openapi/agora.json are copies of cloudevents/*.json
// made by bundle; hand edits elsewhere in the file are kept. The file is
// written in one canonical form (keys sorted, two-space indent), so the
// test compares bytes (docs/api.md).
func TestOpenAPIFileIsCurrent(t *testing.T) {
	raw, err := os.ReadFile(OpenAPIName)
	if err != nil {
		t.Fatal(err)
	}
	want, err := bundle(raw, files)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if !bytes.Equal(raw, want) {
			if err := os.WriteFile(OpenAPIName, want, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("rewrote %s", OpenAPIName)
		}
		return
	}
	if i := bytes.IndexFunc(raw, func(r rune) bool { return r >= 0x7f }); i >= 0 {
		t.Errorf("schema/%s has a character beyond ASCII at byte %d: write it as a \\u escape (go generate ./schema does)", OpenAPIName, i)
	}
	if !bytes.Equal(raw, want) {
		t.Errorf("schema/%s is not current with schema/cloudevents (or not in canonical form): run go generate ./schema\n%s", OpenAPIName, firstDiff(raw, want))
	}
}

// firstDiff shows where two texts part, a few lines of each.
func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		if i >= len(al) || i >= len(bl) || al[i] != bl[i] {
			lines := func(l []string) string { return strings.Join(l[min(i, len(l)):min(i+4, len(l))], "\n") }
			return fmt.Sprintf("line %d:\n--- file\n%s\n--- current\n%s", i+1, lines(al), lines(bl))
		}
	}
	return ""
}

// bundle returns the document raw with its copies of the event schemas of
// fsys made anew: each cloudevents/<name>.json becomes the component
// <name> (common.json's $defs the components common.<def>), with every
// reference rewritten to #/components/schemas/<name>, a top-level $ref
// beside other keywords moved into an allOf (as generators read it), and
// Round built from Record (a Record whose events are CloudEvents).
func bundle(raw []byte, fsys fs.FS) ([]byte, error) {
	doc, err := decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", OpenAPIName, err)
	}
	schemas := doc.(map[string]any)["components"].(map[string]any)["schemas"].(map[string]any)
	names, err := fs.Glob(fsys, Dir+"/*.json")
	if err != nil {
		return nil, err
	}
	for _, p := range names {
		file := path.Base(p)
		name := strings.TrimSuffix(file, ".json")
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, err
		}
		v, err := decode(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		s := v.(map[string]any)
		delete(s, "$schema")
		delete(s, "$id")
		if defs, ok := s["$defs"].(map[string]any); ok {
			for def, d := range defs {
				c, err := component(d, name)
				if err != nil {
					return nil, fmt.Errorf("%s#/$defs/%s: %w", file, def, err)
				}
				schemas[name+"."+def] = c
			}
			delete(s, "$defs")
		}
		c, err := component(s, name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		schemas[name] = c
	}

	rec, ok := schemas["Record"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: no component Record", OpenAPIName)
	}
	round := map[string]any{}
	for k, v := range rec {
		round[k] = v
	}
	props := map[string]any{}
	for k, v := range rec["properties"].(map[string]any) {
		props[k] = v
	}
	props["events"] = map[string]any{"type": "array", "description": "The round's lifecycle CloudEvents, in order.",
		"items": map[string]any{"$ref": "#/components/schemas/CloudEvent"}}
	round["properties"] = props
	round["description"] = "One round of a thread: its record (Record), with the round's lifecycle CloudEvents as events."
	schemas["Round"] = round

	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return asciiJSON(out.Bytes()), nil
}

// asciiJSON writes every character of JSON text b beyond ASCII, and DEL,
// as a \u escape (a surrogate pair above U+FFFF): valid JSON either way,
// but readers that take the document as YAML (ogen does) refuse raw DEL
// and C1 characters such as U+0085 in the patterns.
func asciiJSON(b []byte) []byte {
	var out bytes.Buffer
	for _, r := range string(b) {
		switch {
		case r < 0x7f:
			out.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&out, "\\u%04x\\u%04x", r1, r2)
		default:
			fmt.Fprintf(&out, "\\u%04x", r)
		}
	}
	return out.Bytes()
}

func decode(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// component rewrites the references of a schema of file self (without
// ".json") to components, and a top-level $ref with siblings into an allOf.
func component(v any, self string) (any, error) {
	if err := rewriteRefs(v, self); err != nil {
		return nil, err
	}
	s, ok := v.(map[string]any)
	if !ok {
		return v, nil
	}
	ref, ok := s["$ref"]
	if !ok || len(s) == 1 {
		return s, nil
	}
	// {"$ref": X, k: v…} holds where {"allOf": [X, {k: v…}]} does; the
	// annotations stay outside so generators name the type by them.
	rest := map[string]any{}
	out := map[string]any{}
	for k, e := range s {
		switch k {
		case "$ref":
		case "title", "description", "$comment", "examples":
			out[k] = e
		default:
			rest[k] = e
		}
	}
	out["allOf"] = []any{map[string]any{"$ref": ref}, rest}
	return out, nil
}

func rewriteRefs(v any, self string) error {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if s, ok := x[k].(string); ok && k == "$ref" {
				r, err := componentRef(s, self)
				if err != nil {
					return err
				}
				x[k] = r
				continue
			}
			if err := rewriteRefs(x[k], self); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := rewriteRefs(e, self); err != nil {
				return err
			}
		}
	}
	return nil
}

// componentRef maps a reference of file self to its component: "#/$defs/d"
// → self.d, "<SchemaBase>f.json" → f, "<SchemaBase>f.json#/$defs/d" → f.d.
func componentRef(ref, self string) (string, error) {
	file, frag := self, ref
	if rest, ok := strings.CutPrefix(ref, lifecycle.SchemaBase); ok {
		f, fr, _ := strings.Cut(rest, "#")
		file, frag = strings.TrimSuffix(f, ".json"), "#"+fr
	}
	switch {
	case frag == "#" && file != self:
		return "#/components/schemas/" + file, nil
	case strings.HasPrefix(frag, "#/$defs/") && !strings.Contains(strings.TrimPrefix(frag, "#/$defs/"), "/"):
		return "#/components/schemas/" + file + "." + strings.TrimPrefix(frag, "#/$defs/"), nil
	}
	return "", fmt.Errorf("reference %q: only another schema file or one of its $defs can become a component", ref)
}
