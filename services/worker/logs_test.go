package worker_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// A dispatch's log lines carry the trace and span ids of the traceparent
// its work message came with, and its timeout reads as a duration string.
func TestFinishedDispatchLogLinesCarryTheTrace(t *testing.T) {
	t.Setenv("AGORA_LOG_LEVEL", "info")
	t.Setenv("AGORA_LOG_FORMAT", "json")
	var out testkit.Buffer
	log, err := logging.New(&out)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{Logger: log})
	h.shell("traced", `echo ok`)
	id := h.dispatch(lifecycle.Request{Subagent: "traced", Timeout: "90s"})
	term := h.terminal(id)
	if _, ok := term.Data.(*lifecycle.Finished); !ok {
		t.Fatalf("not finished: %+v", term.Data)
	}
	trace := lifecycle.TraceID(lifecycle.Traceparent(term.Event))
	// "dispatch ended" is written just after the terminal event is stored.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), `"msg":"dispatch ended"`) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	seen := map[string]bool{}
	for line := range strings.Lines(out.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["dispatch_id"] != id {
			continue
		}
		msg, _ := m["msg"].(string)
		seen[msg] = true
		if m["trace_id"] != trace || len(m["span_id"].(string)) != 16 {
			t.Errorf("%q: trace_id %v span_id %v, want trace %s", msg, m["trace_id"], m["span_id"], trace)
		}
		if msg == "running" && m["timeout"] != "1m30s" {
			t.Errorf("running: timeout %v, want \"1m30s\"", m["timeout"])
		}
	}
	if !seen["running"] || !seen["dispatch ended"] {
		t.Errorf("lines of %s: %v", id, seen)
	}
}
