package clip

import "strings"

// Line shortens s to n runes for a table cell or a one-line summary: runs
// of white space (newlines too) become one space, and a longer text is cut
// to n-1 runes followed by "…".
func Line(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
