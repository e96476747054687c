package clip_test

import (
	"testing"

	"github.com/agora-dispatch/agora/internal/clip"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		s            string
		n            int
		prefix, full string
	}{
		{"short", 10, "short", "short"},
		{"exactly", 7, "exactly", "exactly"},
		{"abcdef", 3, "abc", "abc…"},
		{"héllo", 2, "h", "h…"}, // é is two bytes: not split
		{"日本語", 4, "日", "日…"},
		{"日本語", 0, "", "…"},
		{"abc", -1, "", "…"},
	} {
		if got := clip.Prefix(tc.s, tc.n); got != tc.prefix {
			t.Errorf("Prefix(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.prefix)
		}
		if got := clip.String(tc.s, tc.n); got != tc.full {
			t.Errorf("String(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.full)
		}
	}
}
