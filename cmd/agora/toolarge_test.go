package main_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A dispatch over a size limit is refused before it is sent, with one
// message naming both limits and how to pass large data — no "retry" —
// and exit code 1; no dispatch exists.
func TestDispatchTooLarge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, id string
		n        int
	}{
		{"input over its limit", "toolarge-a", lifecycle.MaxInputBytes + 1},
		{"over the max payload", "toolarge-b", 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := writeFile(t, "input.json", `{"data":"`+strings.Repeat("x", tc.n)+`"}`)
			r := agora(t, "dispatch", "demo", "--id", tc.id, "--input", "@"+file)
			if r.code != 1 {
				t.Fatalf("exit %d, want 1: %s", r.code, r)
			}
			for _, want := range []string{strconv.Itoa(lifecycle.MaxInputBytes), "by reference", "read_paths", "nothing was dispatched"} {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr does not say %q: %s", want, r)
				}
			}
			if strings.Contains(strings.ToLower(r.stderr), "retry") || strings.Contains(r.stderr, "maximum payload exceeded") {
				t.Errorf("stderr advises a retry: %s", r)
			}
			if s := agora(t, "status", tc.id); s.code != 1 {
				t.Errorf("the dispatch exists: %s", s)
			}
		})
	}
}
