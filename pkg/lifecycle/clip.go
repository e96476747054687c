package lifecycle

import "unicode/utf8"

// Clip cuts s to at most n bytes on a character boundary and adds "…" when
// it cut: how a text longer than its field's limit (a progress message, an
// error's detail) is shortened.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
