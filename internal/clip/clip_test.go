package clip_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agora-dispatch/agora/internal/clip"
)

// Prefix keeps, for every n, the longest prefix of at most n bytes that
// ends on a character boundary. (String is lifecycle.Clip, tested there.)
func TestPrefix(t *testing.T) {
	for _, s := range []string{"", "short", "exactly", "abcdef", "héllo", "日本語", "a日b"} {
		for n := -1; n <= len(s)+1; n++ {
			got := clip.Prefix(s, n)
			if !strings.HasPrefix(s, got) || !utf8.ValidString(got) || len(got) > max(n, 0) {
				t.Errorf("Prefix(%q, %d) = %q: not a whole-character prefix of at most %d bytes", s, n, got, max(n, 0))
				continue
			}
			if rest := s[len(got):]; rest != "" {
				if _, size := utf8.DecodeRuneInString(rest); len(got)+size <= n {
					t.Errorf("Prefix(%q, %d) = %q: the next character fits too", s, n, got)
				}
			}
		}
	}
}
