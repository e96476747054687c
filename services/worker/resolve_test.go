package worker_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

const validSentinel = `{"question":"Rename parse or load?","options":["parse","load"],"context":"both read config","kind":"decision","partial_state":{"big":1e400,"considered":["parse","load"]}}`

// TestResolutionRule runs every row of the sentinel resolution rule
// (docs/wire.md, "The sentinel file") through a real exec sub-agent and a
// real worker.
func TestResolutionRule(t *testing.T) {
	h := newHarness(t, provision.Config{})
	cfg := h.workerConfig()
	cfg.Concurrency = 6
	h.startWorker(cfg, worker.Deps{})

	type want struct {
		kind     lifecycle.Kind
		reason   lifecycle.Reason
		exitCode *int
		detail   string // substring of failed.detail
	}
	code := func(n int) *int { return &n }
	cases := []struct {
		name    string
		script  string
		command []string
		timeout string
		want    want
	}{
		{name: "valid-exit0", script: `printf '%s' '` + validSentinel + `' > "$AGORA_NEEDS_INPUT_FILE"`, want: want{kind: lifecycle.KindNeedsInput}},
		{name: "valid-exit7", script: `printf '%s' '` + validSentinel + `' > "$AGORA_NEEDS_INPUT_FILE"; exit 7`, want: want{kind: lifecycle.KindNeedsInput}},
		{name: "valid-killed-by-timeout", script: `printf '%s' '` + validSentinel + `' > "$AGORA_NEEDS_INPUT_FILE"; exec sleep 60`, timeout: "1s", want: want{kind: lifecycle.KindNeedsInput}},
		{name: "malformed", script: `echo '{"question": 5}' > "$AGORA_NEEDS_INPUT_FILE"`, want: want{kind: lifecycle.KindFailed, reason: lifecycle.ReasonWorkerFailed, detail: "question"}},
		{name: "oversized", script: `head -c 1048577 /dev/zero | tr '\0' ' ' > "$AGORA_NEEDS_INPUT_FILE"`, want: want{kind: lifecycle.KindFailed, reason: lifecycle.ReasonWorkerFailed, detail: "oversized"}},
		{name: "symlink", script: `printf '%s' '` + validSentinel + `' > real.json; ln -s "$PWD/real.json" "$AGORA_NEEDS_INPUT_FILE"`, want: want{kind: lifecycle.KindFailed, reason: lifecycle.ReasonWorkerFailed, detail: "symlink"}},
		{name: "absent-exit0", script: `echo hello from the agent; echo '{"result":42}' > "$AGORA_OUTPUT_FILE"`, want: want{kind: lifecycle.KindFinished}},
		{name: "absent-exit3", script: `echo boom >&2; exit 3`, want: want{kind: lifecycle.KindFailed, reason: lifecycle.ReasonProviderFailed, exitCode: code(3), detail: "boom"}},
		{name: "absent-timeout", script: `exec sleep 60`, timeout: "1s", want: want{kind: lifecycle.KindFailed, reason: lifecycle.ReasonTimeout}},
		{name: "command-not-found", command: []string{"agora-no-such-command"}, want: want{kind: lifecycle.KindFailed, reason: lifecycle.ReasonWorkerFailed, detail: "not found"}},
	}
	ids := map[string]string{}
	for _, c := range cases {
		h.shell(c.name, c.script, func(d *subagent.Definition) {
			if c.command != nil {
				d.Command = c.command
			}
		})
		ids[c.name] = h.dispatch(lifecycle.Request{Subagent: c.name, Input: json.RawMessage(`{"task":"t"}`), Timeout: c.timeout})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := h.terminal(ids[c.name])
			l := r.Data.(lifecycle.Lifecycle)
			if l.LifecycleKind() != c.want.kind {
				t.Fatalf("kind = %s, want %s (%+v)", l.LifecycleKind(), c.want.kind, r.Data)
			}
			if r.Event.ID() != lifecycle.TerminalID(ids[c.name]) {
				t.Errorf("terminal event id = %q, want %q", r.Event.ID(), lifecycle.TerminalID(ids[c.name]))
			}
			switch d := r.Data.(type) {
			case *lifecycle.NeedsInput:
				if d.Question != "Rename parse or load?" || strings.Join(d.Options, ",") != "parse,load" || d.Kind != "decision" || d.Context != "both read config" {
					t.Errorf("needs_input = %+v", d)
				}
				if string(d.PartialState) != `{"big":1e400,"considered":["parse","load"]}` {
					t.Errorf("partial_state = %s, want the bytes the sub-agent wrote", d.PartialState)
				}
				if d.QuestionID != lifecycle.QuestionID(ids[c.name]) {
					t.Errorf("question_id = %q", d.QuestionID)
				}
			case *lifecycle.Finished:
				if string(d.Output) != `{"result":42}` {
					t.Errorf("output = %s", d.Output)
				}
				if !strings.Contains(d.StdoutTail, "hello from the agent") {
					t.Errorf("stdout_tail = %q", d.StdoutTail)
				}
			case *lifecycle.Failed:
				if d.Reason != c.want.reason {
					t.Errorf("reason = %s, want %s (detail %q)", d.Reason, c.want.reason, d.Detail)
				}
				if !strings.Contains(d.Detail, c.want.detail) {
					t.Errorf("detail = %q, want it to mention %q", d.Detail, c.want.detail)
				}
				if c.want.exitCode != nil && (d.ExitCode == nil || *d.ExitCode != *c.want.exitCode) {
					t.Errorf("exit_code = %v, want %d", d.ExitCode, *c.want.exitCode)
				}
			}
			h.assertOneTerminal(ids[c.name])
			evs := h.events(ids[c.name])
			if k := kinds(evs); len(k) != 2 || k[0] != lifecycle.KindStarted {
				t.Errorf("events = %v, want [started %s]", k, c.want.kind)
			}
			if st, ok := evs[0].Data.(*lifecycle.Started); !ok || st.Attempt != 1 || st.WorkerID == "" {
				t.Errorf("started = %+v", evs[0].Data)
			}
			if lifecycle.TraceID(lifecycle.Traceparent(r.Event)) == "" {
				t.Error("terminal event lost the request's traceparent")
			}
		})
	}
	h.waitWorkEmpty()
}
