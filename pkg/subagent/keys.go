package subagent

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// unknownKeys reports every key of the YAML (or JSON) document b that is
// not a field of a Definition, each with its line and the field it most
// likely meant ("line 3: timout: not a field of a definition; did you mean
// timeout?"). A document that does not parse as YAML says where.
func unknownKeys(b []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("not valid YAML (or JSON): %w", err)
	}
	if len(doc.Content) == 0 {
		return errors.New("the definition is empty: want a YAML (or JSON) mapping with name, runtime and command")
	}
	var errs []error
	checkKeys(doc.Content[0], reflect.TypeFor[Definition](), "", &errs)
	return errors.Join(errs...)
}

// checkKeys checks the keys of mapping n against the JSON fields of t,
// and the values of known fields against their own types.
func checkKeys(n *yaml.Node, t reflect.Type, where string, errs *[]error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case n.Kind == yaml.AliasNode && n.Alias != nil:
		checkKeys(n.Alias, t, where, errs)
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := jsonFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				in := "a definition"
				if where != "" {
					in = where
				}
				msg := fmt.Sprintf("line %d: %s: not a field of %s", k.Line, k.Value, in)
				if s := closest(k.Value, fields); s != "" {
					msg += "; did you mean " + s + "?"
				} else {
					msg += " (" + strings.Join(sortedKeys(fields), ", ") + ")"
				}
				*errs = append(*errs, errors.New(msg))
				continue
			}
			checkKeys(v, ft, strings.TrimPrefix(where+"."+k.Value, "."), errs)
		}
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && n.Kind == yaml.SequenceNode:
		for _, e := range n.Content {
			checkKeys(e, t.Elem(), where, errs)
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			checkKeys(n.Content[i], t.Elem(), where, errs)
		}
	}
}

// jsonFields maps the JSON names of t's fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func sortedKeys(m map[string]reflect.Type) []string { return slices.Sorted(maps.Keys(m)) }

// closest is the field name nearest to key, within two edits (or a
// different case, or '-' for '_'); empty when none is that near.
func closest(key string, fields map[string]reflect.Type) string {
	norm := strings.ReplaceAll(strings.ToLower(key), "-", "_")
	if _, ok := fields[norm]; ok {
		return norm
	}
	return Closest(norm, sortedKeys(fields))
}

// Closest is the one of names nearest to name within two edits, for a
// "did you mean" (a runtime's name, say); empty when none is that near.
func Closest(name string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := distance(name, n); d < bestD && d > 0 {
			best, bestD = n, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
