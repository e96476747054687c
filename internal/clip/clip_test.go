package clip_test

import (
	"testing"

	"github.com/agora-dispatch/agora/internal/clip"
)

// String is lifecycle.Clip, whose test covers it; Prefix is the same cut
// without the mark.
func TestPrefix(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdef", 3, "abc"},
		{"héllo", 2, "h"}, // é is two bytes: not split
		{"日本語", 4, "日"},
		{"日本語", 0, ""},
		{"abc", -1, ""},
	} {
		if got := clip.Prefix(tc.s, tc.n); got != tc.want {
			t.Errorf("Prefix(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}
