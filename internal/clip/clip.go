// Package clip shortens text for messages, records and pages without
// splitting a UTF-8 character.
package clip

import (
	"unicode/utf8"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Prefix returns the longest prefix of s of at most n bytes that ends on
// a character boundary.
func Prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// String is lifecycle.Clip: Prefix followed by "…" when s was cut.
func String(s string, n int) string { return lifecycle.Clip(s, n) }
