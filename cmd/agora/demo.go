package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// demoDefinition is the `demo` sub-agent `agora dev` registers: it runs
// this binary's hidden demo-agent verb. A binary `go run` built lives in a
// temporary build folder that is gone once `go run` ends (and reads badly
// in `agora subagent get demo`), so such a binary is copied to binDir first.
func demoDefinition(binDir string) (subagent.Definition, error) {
	exe, err := os.Executable()
	if err != nil {
		return subagent.Definition{}, err
	}
	if exe, err = stableExecutable(exe, binDir); err != nil {
		return subagent.Definition{}, err
	}
	return subagent.Definition{
		Name: "demo", Runtime: subagent.RuntimeExec, Command: []string{exe, "demo-agent"},
		Timeout: "5m", MaxRounds: 5,
		Description: "Asks which of two functions to rename on its first round, then does it with the answer.",
	}, nil
}

// stableExecutable returns exe, or for a binary in a `go run` build folder
// (…/go-build…/exe/…) a copy of it in binDir, replaced atomically.
func stableExecutable(exe, binDir string) (string, error) {
	if !strings.Contains(filepath.ToSlash(exe), "/go-build") {
		return exe, nil
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", fmt.Errorf("demo sub-agent: %w", err)
	}
	in, err := os.Open(exe)
	if err != nil {
		return "", fmt.Errorf("demo sub-agent: %w", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(binDir, ".agora-*")
	if err != nil {
		return "", fmt.Errorf("demo sub-agent: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return "", fmt.Errorf("demo sub-agent: copy %s: %w", exe, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", fmt.Errorf("demo sub-agent: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("demo sub-agent: %w", err)
	}
	dst := filepath.Join(binDir, filepath.Base(exe))
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("demo sub-agent: %w", err)
	}
	return dst, nil
}

type demoAnalysis struct {
	Task       string            `json:"task"`
	Candidates map[string]string `json:"candidates"`
	CallSites  map[string]int    `json:"call_sites"`
	RuledOut   map[string]string `json:"ruled_out"`
	Tentative  string            `json:"tentative"`
	NextSteps  []string          `json:"next_steps"`
}

func newDemoAgentCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "demo-agent",
		Short:  "The demo sub-agent (run by a worker, not by hand)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws := os.Getenv("AGORA_WORKSPACE")
			if ws == "" {
				return errors.New("demo-agent runs inside an Agora workspace (AGORA_WORKSPACE is not set)")
			}
			var input map[string]json.RawMessage
			b, err := os.ReadFile(os.Getenv("AGORA_INPUT_FILE"))
			if err != nil {
				return err
			}
			if err := json.Unmarshal(b, &input); err != nil {
				return fmt.Errorf("input.json: %w", err)
			}
			var task string
			_ = json.Unmarshal(input["task"], &task)
			if task == "" {
				task = "rename the config loader to loadConfig"
			}
			answer := answerOf(input["answer"])
			if answer == "" {
				// Round 0: analyse, then ask instead of guessing.
				state, _ := json.Marshal(demoAnalysis{
					Task: task,
					Candidates: map[string]string{
						"parseConfig": "config/parse.go:12 — parses bytes, no I/O",
						"readConfig":  "config/read.go:30 — opens the file, then calls parseConfig",
					},
					CallSites: map[string]int{"parseConfig": 3, "readConfig": 11},
					RuledOut:  map[string]string{"loadDefaults": "only fills defaults; never reads a file"},
					Tentative: "readConfig is the public entry point, but renaming parseConfig keeps the diff small",
					NextSteps: []string{"rename the chosen function", "update its call sites", "run the tests"},
				})
				fmt.Println("analysed 3 candidates; two remain and only the operator can choose")
				return sentinel.Write(ws, sentinel.Request{
					Question:     "Which function should I rename to loadConfig?",
					Options:      []string{"parseConfig", "readConfig"},
					Context:      "parseConfig (3 call sites) parses bytes; readConfig (11 call sites) opens the file and calls parseConfig.",
					Kind:         sentinel.KindDecision,
					PartialState: state,
				})
			}
			var prior demoAnalysis
			reused := json.Unmarshal(input["partial_state"], &prior) == nil && len(prior.CallSites) > 0
			out := map[string]any{
				"task":            task,
				"renamed":         answer,
				"to":              "loadConfig",
				"call_sites":      prior.CallSites[answer],
				"reused_analysis": reused,
				"summary":         fmt.Sprintf("renamed %s to loadConfig and updated %d call sites, reusing the round-0 analysis", answer, prior.CallSites[answer]),
			}
			fmt.Println(out["summary"])
			b, _ = json.MarshalIndent(out, "", "  ")
			return os.WriteFile(filepath.Join(ws, ".agora", "output.json"), b, 0o600)
		},
	}
}

// answerOf reads input.answer as a string, or as an object with an
// "answer" field.
func answerOf(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Answer string `json:"answer"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.Answer
}
