package dispatcher_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"

	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// logLines collects JSON log lines written concurrently.
type logLines struct{ testkit.Buffer }

// find returns the first line whose msg starts with prefix, or nil.
func (l *logLines) find(prefix string) map[string]any {
	for line := range strings.Lines(l.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && strings.HasPrefix(m["msg"].(string), prefix) {
			return m
		}
	}
	return nil
}

// The dispatcher's log lines about one dispatch carry the trace and span
// ids of its traceparent, and durations read as "1.5s" (internal/logging).
func TestDispatchLogLinesCarryTheTrace(t *testing.T) {
	t.Setenv("AGORA_LOG_LEVEL", "debug")
	t.Setenv("AGORA_LOG_FORMAT", "json")
	var lines logLines
	log, err := logging.New(&lines)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, dispatcher.Config{})
	h.stop()
	h.logger = log
	h.interruptedRecord("logs-reconciled") // stored with testTrace
	h.start(dispatcher.Config{ReconcileGrace: 100 * time.Millisecond})

	h.dispatchVia("http", "logs-1", `{"dispatch_id":"logs-1","subagent":"planner"}`)
	const httpTrace = "00-11111111111111111111111111111111-2222222222222222-01"
	const streamTrace = "00-33333333333333333333333333333333-4444444444444444-01"
	if resp, data := h.do(http.MethodPost, "/v1/dispatches", `{"dispatch_id":"logs-1","subagent":"planner","input":{"x":1}}`, "", "traceparent", httpTrace); resp.StatusCode != http.StatusConflict {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	// The event carries a span of its own in the trace.
	sent := h.publishRequest(lifecycle.Request{DispatchID: "logs-1", Subagent: "planner", Input: json.RawMessage(`{"x":2}`)}, lifecycle.WithTraceparent(streamTrace))
	streamSpan := strings.Split(lifecycle.Traceparent(sent), "-")[2]

	for _, c := range []struct{ msg, trace, span string }{
		{"request refused: its dispatch_id belongs to a different request", "11111111111111111111111111111111", "2222222222222222"},
		{"request dropped: its dispatch_id belongs to a different request", "33333333333333333333333333333333", streamSpan},
		{"reconciled an interrupted acceptance", lifecycle.TraceID(testTrace), strings.Split(testTrace, "-")[2]},
	} {
		var line map[string]any
		h.eventually("log line "+c.msg, func() bool { line = lines.find(c.msg); return line != nil })
		if line["trace_id"] != c.trace || line["span_id"] != c.span {
			t.Errorf("%s: trace_id %v span_id %v, want %s %s", c.msg, line["trace_id"], line["span_id"], c.trace, c.span)
		}
		if line["dispatch_id"] == nil {
			t.Errorf("%s: no dispatch_id: %v", c.msg, line)
		}
	}
	if age, ok := lines.find("reconciled an interrupted acceptance")["age"].(string); !ok {
		t.Errorf("age is not a duration string: %v", age)
	} else if _, err := time.ParseDuration(age); err != nil {
		t.Errorf("age %q: %v", age, err)
	}
}
