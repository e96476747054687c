package runtimes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"text/template"
)

// PromptData is what a prompt template sees.
type PromptData struct {
	Input        map[string]any
	Answer       any
	PartialState any
}

// RenderPrompt renders a definition's prompt template with the input, the
// answer and the partial state of a resumed run.
func RenderPrompt(tmpl string, input map[string]json.RawMessage) (string, error) {
	t, err := template.New("prompt").Option("missingkey=zero").Parse(tmpl)
	if err != nil {
		return "", fmt.Errorf("prompt template: %w", err)
	}
	data := PromptData{Input: map[string]any{}, Answer: "", PartialState: ""}
	for k, v := range input {
		var x any
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.UseNumber()
		if err := dec.Decode(&x); err != nil {
			return "", fmt.Errorf("prompt input %q: %w", k, err)
		}
		data.Input[k] = x
	}
	if a, ok := data.Input["answer"]; ok && a != nil {
		data.Answer = a
		if m, ok := a.(map[string]any); ok {
			if v, ok := m["answer"]; ok {
				data.Answer = v
			}
		}
	}
	if ps, ok := input["partial_state"]; ok && string(ps) != "null" {
		var out bytes.Buffer
		if json.Indent(&out, ps, "", "  ") == nil {
			data.PartialState = out.String()
		}
	}
	var buf strings.Builder
	if err := t.Execute(&buf, data); err != nil {
		return "", fmt.Errorf("prompt template: %w", err)
	}
	return buf.String(), nil
}
