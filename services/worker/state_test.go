package worker_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// copyInput is an exec sub-agent that copies its input.json out of the
// workspace into $COPY_DIR.
const copyInput = `cp "$AGORA_INPUT_FILE" "$COPY_DIR/input.json"`

// TestLargePartialStateRoundTrip: a partial_state above MaxInlineState
// goes to the agora_state object store by reference, byte for byte, and a
// resume request carrying that reference gets it back as
// input.partial_state in input.json.
func TestLargePartialStateRoundTrip(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})

	// The state keeps its own spacing and a number outside float64 range,
	// so any re-encoding shows.
	blob := strings.Repeat("a", lifecycle.MaxInlineState+100)
	state := `{"blob": "` + blob + `", "n": 1e400, "steps": ["one", "two"]}`
	h.shell("big-state", `blob=$(head -c `+strconv.Itoa(len(blob))+` /dev/zero | tr '\0' a)
printf '{"question":"Continue?","kind":"clarification","partial_state":{"blob": "%s", "n": 1e400, "steps": ["one", "two"]}}' "$blob" > "$AGORA_NEEDS_INPUT_FILE"`)
	id := h.dispatch(lifecycle.Request{Subagent: "big-state", Input: json.RawMessage(`{"task":"t"}`)})
	r := h.terminal(id)
	ni, ok := r.Data.(*lifecycle.NeedsInput)
	if !ok {
		t.Fatalf("terminal = %T %+v, want needs_input", r.Data, r.Data)
	}
	if len(ni.PartialState) != 0 {
		t.Errorf("partial_state travels inline (%d bytes); want only a reference above %d bytes", len(ni.PartialState), lifecycle.MaxInlineState)
	}
	if ni.PartialStateRef == "" {
		t.Fatal("needs_input has no partial_state_ref")
	}
	store := natstest.ObjectStore(t, h.js, lifecycle.BucketState)
	stored, err := store.GetBytes(t.Context(), ni.PartialStateRef)
	if err != nil {
		t.Fatalf("object %q in %s: %v", ni.PartialStateRef, lifecycle.BucketState, err)
	}
	if string(stored) != state {
		t.Fatalf("stored state (%d bytes) differs from the sentinel's partial_state (%d bytes)", len(stored), len(state))
	}

	// The router's re-dispatch: original input + answer, state by reference.
	h.shell("resume-copy", copyInput)
	dir := t.TempDir()
	resumed := h.dispatch(lifecycle.Request{
		Subagent: "resume-copy", ThreadID: id, ParentID: id, Round: 1, QuestionID: ni.QuestionID,
		Input:           json.RawMessage(`{"task":"t","answer":{"answer":"yes","answered_by":"alice"}}`),
		PartialStateRef: ni.PartialStateRef,
		Env:             map[string]string{"COPY_DIR": dir},
	})
	if k := h.terminal(resumed).Data.(lifecycle.Lifecycle).LifecycleKind(); k != lifecycle.KindFinished {
		t.Fatalf("resume ended %s, want finished", k)
	}
	var in map[string]json.RawMessage
	readJSONFile(t, filepath.Join(dir, "input.json"), &in)
	// input.json is re-encoded compactly, so the state arrives as the same
	// JSON without the sentinel's insignificant spaces.
	var want bytes.Buffer
	if err := json.Compact(&want, stored); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in["partial_state"], want.Bytes()) {
		t.Errorf("input.partial_state (%d bytes) is not the stored state (%d bytes compacted)", len(in["partial_state"]), want.Len())
	}
	if string(in["task"]) != `"t"` || string(in["answer"]) != `{"answer":"yes","answered_by":"alice"}` {
		t.Errorf("input.json lost the original input or the answer: task=%s answer=%s", in["task"], in["answer"])
	}
}

// TestMissingPartialStateRef: a reference to a state object that does not
// exist ends the dispatch failed worker-failed rather than running the
// sub-agent without its state.
func TestMissingPartialStateRef(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	dir := t.TempDir()
	h.shell("resume-copy", copyInput)
	id := h.dispatch(lifecycle.Request{Subagent: "resume-copy", Input: json.RawMessage(`{}`), PartialStateRef: "no-such-state", Env: map[string]string{"COPY_DIR": dir}})
	failedWith(t, h.terminal(id), lifecycle.ReasonWorkerFailed, "no-such-state")
	assertNoFile(t, filepath.Join(dir, "input.json"))
}

// TestInputFile: input.json holds the request's input — every member with
// the same JSON value, numbers keeping their text — and an input that is
// not a JSON object ends failed worker-failed without running.
func TestInputFile(t *testing.T) {
	h := newHarness(t, provision.Config{})
	cfg := h.workerConfig()
	cfg.Concurrency = 6
	h.startWorker(cfg, worker.Deps{})
	h.shell("copy-input", copyInput)

	cases := []struct {
		name  string
		input string
		want  string // expected input.json as JSON; "" for failed worker-failed
	}{
		{name: "object", input: `{"task":"plan","n":12345678901234567890123,"f":1e400,"neg":-0.5e-10,"s":"üñí \"q\" <b>&amp;</b>","nested":{"z":[1,{"b":null}],"a":true},"empty":{}}`,
			want: `{"task":"plan","n":12345678901234567890123,"f":1e400,"neg":-0.5e-10,"s":"üñí \"q\" <b>&amp;</b>","nested":{"z":[1,{"b":null}],"a":true},"empty":{}}`},
		{name: "null input", input: `null`, want: `{}`},
		{name: "no input", input: ``, want: `{}`},
		{name: "array", input: `[1,2]`},
		{name: "string", input: `"do it"`},
		{name: "number", input: `5`},
	}
	ids := map[string]string{}
	dirs := map[string]string{}
	for _, c := range cases {
		dirs[c.name] = t.TempDir()
		var in json.RawMessage
		if c.input != "" {
			in = json.RawMessage(c.input)
		}
		ids[c.name] = h.dispatch(lifecycle.Request{Subagent: "copy-input", Input: in, Env: map[string]string{"COPY_DIR": dirs[c.name]}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := h.terminal(ids[c.name])
			if c.want == "" {
				failedWith(t, r, lifecycle.ReasonWorkerFailed, "not a JSON object")
				assertNoFile(t, filepath.Join(dirs[c.name], "input.json"))
				return
			}
			if k := r.Data.(lifecycle.Lifecycle).LifecycleKind(); k != lifecycle.KindFinished {
				t.Fatalf("terminal = %s %+v, want finished", k, r.Data)
			}
			got := decodeJSONNumbers(t, must(os.ReadFile(filepath.Join(dirs[c.name], "input.json"))))
			if want := decodeJSONNumbers(t, []byte(c.want)); !reflect.DeepEqual(got, want) {
				t.Errorf("input.json = %v\nwant         %v", got, want)
			}
		})
	}
}

// decodeJSONNumbers decodes b keeping every number's text (json.Number).
func decodeJSONNumbers(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return v
}

// assertNoFile fails when path exists.
func assertNoFile(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists (or cannot be checked: %v); want it absent", path, err)
	}
}
