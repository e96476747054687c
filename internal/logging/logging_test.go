package logging_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/logging"
)

func TestBadSettingsAreErrors(t *testing.T) {
	for _, c := range []struct{ level, format, want string }{
		{"loud", "", "AGORA_LOG_LEVEL=\"loud\": want debug, info, warn or error"},
		{"", "xml", "AGORA_LOG_FORMAT=\"xml\": want text or json"},
	} {
		t.Setenv("AGORA_LOG_LEVEL", c.level)
		t.Setenv("AGORA_LOG_FORMAT", c.format)
		if _, err := logging.New(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("level %q format %q: %v, want %q", c.level, c.format, err, c.want)
		}
	}
	for _, ok := range []string{"", "debug", "INFO", "warn", "error"} {
		t.Setenv("AGORA_LOG_LEVEL", ok)
		t.Setenv("AGORA_LOG_FORMAT", "json")
		if _, err := logging.New(&bytes.Buffer{}); err != nil {
			t.Errorf("level %q: %v", ok, err)
		}
	}
}

// Durations read the same in every format, and a traceparent puts its ids
// on the line.
func TestDurationsAndTraceIDs(t *testing.T) {
	t.Setenv("AGORA_LOG_LEVEL", "")
	t.Setenv("AGORA_LOG_FORMAT", "json")
	var buf bytes.Buffer
	log, err := logging.New(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.With(logging.Trace("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")...).Info("x", "timeout", 30*time.Second, "wait", any(1500*time.Millisecond))
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	if line["timeout"] != "30s" || line["wait"] != "1.5s" || line["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" || line["span_id"] != "00f067aa0ba902b7" {
		t.Errorf("line = %v", line)
	}
	for _, junk := range []string{
		"not a traceparent",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
		"00-4bf92f3577b34da6a3ce929d0e0e473\n-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	} {
		if a := logging.Trace(junk); a != nil {
			t.Errorf("Trace(%q) = %v", junk, a)
		}
	}
}

// A duration reads the same inside a group and in the text format.
func TestDurationsInGroupsAndText(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		t.Setenv("AGORA_LOG_FORMAT", format)
		var buf bytes.Buffer
		log, err := logging.New(&buf)
		if err != nil {
			t.Fatal(err)
		}
		log.WithGroup("run").Info("x", "timeout", 5*time.Minute, slog.Group("limits", "grace", 1500*time.Millisecond))
		out := buf.String()
		if strings.Contains(out, "300000000000") || !strings.Contains(out, "5m0s") || !strings.Contains(out, "1.5s") {
			t.Errorf("%s: %s", format, out)
		}
	}
}
