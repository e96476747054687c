// Package clip shortens text for messages, records and pages without
// splitting a UTF-8 character. The cut itself is lifecycle.Clip's, which
// the public packages use too; this package names its variants.
package clip

import (
	"strings"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Prefix returns the longest prefix of s of at most n bytes that ends on
// a character boundary: lifecycle.Clip without its mark.
func Prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.TrimSuffix(lifecycle.Clip(s, n), "…")
}

// String is lifecycle.Clip: Prefix followed by "…" when s was cut.
func String(s string, n int) string { return lifecycle.Clip(s, n) }
