package clip_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agora-dispatch/agora/internal/clip"
)

// Line makes every run of white space one space; for every n, a text that
// fits stays whole and a longer one is cut to n runes, the last "…".
func TestLine(t *testing.T) {
	for _, s := range []string{"", "short", "  two\n lines\t", "eleven runes", "日本語のテキスト"} {
		flat := strings.Join(strings.Fields(s), " ")
		runes := utf8.RuneCountInString(flat)
		for n := 1; n <= runes+1; n++ {
			got := clip.Line(s, n)
			if runes <= n {
				if got != flat {
					t.Errorf("Line(%q, %d) = %q, want %q whole", s, n, got, flat)
				}
				continue
			}
			if utf8.RuneCountInString(got) != n || !strings.HasSuffix(got, "…") || !strings.HasPrefix(flat, strings.TrimSuffix(got, "…")) {
				t.Errorf("Line(%q, %d) = %q: not the first %d runes of %q and an ellipsis", s, n, got, n-1, flat)
			}
		}
	}
}
