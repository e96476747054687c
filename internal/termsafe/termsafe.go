// Package termsafe keeps what sub-agents write from acting on a person's
// terminal (docs/security.md, "What a sub-agent's bytes can reach"): a
// question, a detail or an output shown by the CLI may hold escape
// sequences (a clipboard write through OSC 52, a cursor move that paints a
// forged line) or line breaks that forge a line of their own. Control
// characters — C0 (but a newline and a tab in a Writer), DEL and C1 — are
// written as \u escapes, which read plainly and are valid inside JSON
// strings, so the same writer serves human and JSON output.
package termsafe

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Text returns s with every control character escaped, newlines and tabs
// included: for one field shown on one line. Invalid UTF-8 becomes U+FFFD.
func Text(s string) string {
	if clean(s, false) {
		return s
	}
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		if control(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// control reports whether r is a C0 control, DEL or a C1 control.
func control(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) }

// clean reports whether s holds no control character (but, with
// lines, newlines and tabs) and is valid UTF-8.
func clean(s string, lines bool) bool {
	for _, r := range s {
		if r == utf8.RuneError || control(r) && !(lines && (r == '\n' || r == '\t')) {
			return false
		}
	}
	return true
}

// NewWriter returns a writer that passes what it is given to w with every
// control character escaped but newlines and tabs, which the CLI's own
// layout uses. A UTF-8 sequence split between two writes is held until
// it is whole. Invalid UTF-8 is passed on as it is, a byte at a time
// (such a byte cannot start a C1 control).
func NewWriter(w io.Writer) io.Writer { return &writer{w: w} }

type writer struct {
	w    io.Writer
	held []byte // the start of a UTF-8 sequence a write ended in
}

func (x *writer) Write(p []byte) (int, error) {
	n := len(p)
	if len(x.held) > 0 {
		p = append(x.held, p...)
		x.held = nil
	}
	var out []byte
	for i := 0; i < len(p); {
		c := p[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f {
				out = fmt.Appendf(out, `\u%04x`, c)
			} else {
				out = append(out, c)
			}
			i++
			continue
		}
		if !utf8.FullRune(p[i:]) {
			x.held = append([]byte(nil), p[i:]...)
			break
		}
		r, size := utf8.DecodeRune(p[i:])
		if r != utf8.RuneError && control(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = append(out, p[i:i+size]...)
		}
		i += size
	}
	if _, err := x.w.Write(out); err != nil {
		return 0, err
	}
	return n, nil
}
