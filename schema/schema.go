// Package schema holds Agora's machine-readable wire contract: one JSON
// Schema (draft 2020-12) per CloudEvents data type under cloudevents/, the
// schema of the needs_input sentinel file, and an AsyncAPI 3.0 document of
// every channel (asyncapi.yaml). The files are embedded; [FS] serves them.
//
// [Compile] builds a [Set] that validates event data and sentinel files
// offline: every schema is registered under its $id
// (lifecycle.SchemaBase + file name, the CloudEvents dataschema), so $refs
// between them never touch the network.
//
// The schemas describe what pkg/lifecycle produces; pkg/lifecycle stays the
// authority on the wire format and the golden tests in this package keep the
// two in step.
package schema

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

//go:embed cloudevents/*.json asyncapi.yaml openapi/agora.json
var files embed.FS

// Dir is the directory of the JSON Schemas inside [FS].
const Dir = "cloudevents"

// The schema files that describe no event type on their own.
const (
	// CommonName is the schema of the fields every dispatch event carries,
	// referenced by the event schemas.
	CommonName = "common.json"
	// SentinelName is the schema of the needs_input sentinel file.
	SentinelName = "sentinel.json"
)

// AsyncAPIName is the AsyncAPI 3.0 document's name inside [FS].
const AsyncAPIName = "asyncapi.yaml"

// FS returns the embedded files: cloudevents/*.json and asyncapi.yaml. It
// is read-only and safe for concurrent use.
func FS() fs.FS { return files }

// Set is a compiled set of the embedded schemas. It is immutable and safe
// for concurrent use.
type Set struct {
	byName   map[string]*jsonschema.Schema // file name → compiled schema
	sentinel *jsonschema.Schema
}

// Compile compiles every embedded schema with format assertions enabled.
// Each file is registered under its $id, which must equal
// lifecycle.SchemaBase + its file name, so references resolve offline.
func Compile() (*Set, error) {
	entries, err := fs.ReadDir(files, Dir)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	c.UseLoader(offline{})
	var names []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || path.Ext(name) != ".json" {
			continue
		}
		b, err := files.ReadFile(Dir + "/" + name)
		if err != nil {
			return nil, fmt.Errorf("schema: %w", err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("schema: %s: %w", name, err)
		}
		id := lifecycle.SchemaBase + name
		if obj, ok := doc.(map[string]any); !ok || obj["$id"] != id {
			return nil, fmt.Errorf("schema: %s: $id must be %q", name, id)
		}
		if err := c.AddResource(id, doc); err != nil {
			return nil, fmt.Errorf("schema: %s: %w", name, err)
		}
		names = append(names, name)
	}
	s := &Set{byName: make(map[string]*jsonschema.Schema, len(names))}
	for _, name := range names {
		sch, err := c.Compile(lifecycle.SchemaBase + name)
		if err != nil {
			return nil, fmt.Errorf("schema: compile %s: %w", name, err)
		}
		s.byName[name] = sch
	}
	if s.sentinel = s.byName[SentinelName]; s.sentinel == nil {
		return nil, fmt.Errorf("schema: %s missing", SentinelName)
	}
	return s, nil
}

// offline refuses every URL: all references must resolve to the embedded
// resources or to the metaschemas built into jsonschema/v6.
type offline struct{}

func (offline) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s is not an embedded schema (no network or file access)", url)
}

// ValidateEvent validates data, the JSON data of a CloudEvent of type
// eventType, against the schema lifecycle.SchemaName names. An event type
// outside Agora's vocabulary answers an error wrapping
// lifecycle.ErrUnknownType. For a question event it also checks that the
// data's event field matches the type, as lifecycle.Parse does. A
// validation failure wraps a *jsonschema.ValidationError.
func (s *Set) ValidateEvent(eventType string, data []byte) error {
	name, err := lifecycle.SchemaName(eventType)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	sch := s.byName[name]
	if sch == nil {
		return fmt.Errorf("schema: %s: no schema %s", eventType, name)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("schema: %s: data: %w", eventType, err)
	}
	if err := sch.Validate(v); err != nil {
		return fmt.Errorf("schema: %s: %w", eventType, err)
	}
	if name == "question.json" {
		obj, _ := v.(map[string]any) // the schema requires an object
		ev, _ := obj["event"].(string)
		if lifecycle.QuestionEvent(ev).Type() != eventType {
			return fmt.Errorf("schema: %s: data: event %q does not match the type", eventType, ev)
		}
	}
	return nil
}

// ValidateSentinel validates data, the bytes of a needs_input sentinel
// file, against sentinel.json. A leading UTF-8 byte order mark is ignored,
// as pkg/sentinel ignores it. The size limit and file-type rules are checked
// by pkg/sentinel only. A validation failure wraps a
// *jsonschema.ValidationError.
func (s *Set) ValidateSentinel(data []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))))
	if err != nil {
		return fmt.Errorf("schema: sentinel: %w", err)
	}
	if err := s.sentinel.Validate(v); err != nil {
		return fmt.Errorf("schema: sentinel: %w", err)
	}
	return nil
}
