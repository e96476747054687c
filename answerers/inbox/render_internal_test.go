package inbox

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// indentPrefix indents as json.Indent does, and a state larger than the
// page shows costs what the page shows: an indentation bomb (a megabyte
// nested 500,000 deep) yields at most maxStateShown bytes.
func TestIndentPrefix(t *testing.T) {
	for _, raw := range []string{
		`{"a":[1,2,{"b":"x, \"y\": [z]"}],"c":{},"d":[],"e":{ },"f":[ ]}`,
		`[[[["deep"]]],{"k":null,"t":true,"n":-1.5e3}]`,
		`"just a string with \\ and \" inside"`,
		` { "spaced" : [ 1 , 2 ] } `,
	} {
		var want bytes.Buffer
		if err := json.Indent(&want, bytes.TrimSpace([]byte(raw)), "", "  "); err != nil {
			t.Fatal(err)
		}
		got, whole := indentPrefix([]byte(raw), 1<<20)
		if !whole || got != want.String() {
			t.Errorf("indentPrefix(%s) = %q (whole %v), want %q", raw, got, whole, want.String())
		}
	}
	bomb := strings.Repeat("[", 500000) + strings.Repeat("]", 500000)
	s, n := prettyState(json.RawMessage(bomb))
	if len(s) > maxStateShown+4 || n < len(bomb) {
		t.Errorf("a bomb of %d bytes shows %d bytes and reports %d, want at most %d shown and its size", len(bomb), len(s), n, maxStateShown)
	}
}

// Where a sign-in may send its person: a path inside the inbox, never one
// that leads out once resolved.
func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"/inbox/q/q-1":          "/inbox/q/q-1",
		"/inbox/answered?x=1":   "/inbox/answered?x=1",
		"/inbox":                "/inbox",
		"/inbox/../../evil":     "/inbox/",
		"/inbox/%2e%2e/evil":    "/inbox/",
		"/inbox/..%2f..%2fevil": "/inbox/",
		"/inbox/./q":            "/inbox/",
		"//evil.example/inbox/": "/inbox/",
		"https://evil.example/": "/inbox/",
		"/inbox/login?next=/x":  "/inbox/",
		"/evil":                 "/inbox/",
		"/inbox\\..\\evil":      "/inbox/",
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}
