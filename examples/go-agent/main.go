// Command go-agent is a sub-agent written in Go: it asks with
// sentinel.Write instead of guessing, and finishes on the resumed round.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "go-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	var input struct {
		Task         string          `json:"task"`
		Answer       string          `json:"answer"`
		PartialState json.RawMessage `json:"partial_state"`
	}
	b, err := os.ReadFile(os.Getenv("AGORA_INPUT_FILE"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &input); err != nil {
		return err
	}
	if input.Answer == "" {
		state, _ := json.Marshal(map[string]any{"task": input.Task, "candidates": []string{"A", "B"}})
		return sentinel.Write(os.Getenv("AGORA_WORKSPACE"), sentinel.Request{
			Question:     "Rewrite function A or B?",
			Options:      []string{"A", "B"},
			Context:      "Same signature, different call sites.",
			Kind:         sentinel.KindDecision,
			PartialState: state,
		})
	}
	out, _ := json.Marshal(map[string]any{"rewrote": input.Answer, "resumed_from": input.PartialState})
	return os.WriteFile(os.Getenv("AGORA_OUTPUT_FILE"), out, 0o600)
}
