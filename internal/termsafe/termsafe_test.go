package termsafe_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/agora-dispatch/agora/internal/termsafe"
)

func TestText(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text, ünïcode", "plain text, ünïcode"},
		{"osc52 \x1b]52;c;ZXZpbA==\x07 end", `osc52 \u001b]52;c;ZXZpbA==\u0007 end`},
		{"line\nagora answer q-FAKE yes", `line\u000aagora answer q-FAKE yes`},
		{"tab\there\rcr", `tab\u0009here\u000dcr`},
		{"del\x7f c1\u009b2J", `del\u007f c1\u009b2J`},
		{"bad \xff utf8", "bad \uFFFD utf8"},
	} {
		if got := termsafe.Text(c.in); got != c.want {
			t.Errorf("Text(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestWriter(t *testing.T) {
	var b bytes.Buffer
	w := termsafe.NewWriter(&b)
	// A C1 control split between two writes, and a whole line layout.
	in := []string{"QUESTION\tANSWER\n", "evil \x1b[2J \xc2", "\x9b31m red\x7f\n"}
	for _, s := range in {
		if n, err := w.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if want := "QUESTION\tANSWER\n" + `evil \u001b[2J \u009b31m red\u007f` + "\n"; b.String() != want {
		t.Errorf("wrote %q, want %q", b.String(), want)
	}
	// JSON through the writer stays JSON, and means the same.
	b.Reset()
	raw, _ := json.Marshal(map[string]string{"q": "a\x7fb\u0085c"})
	if _, err := termsafe.NewWriter(&b).Write(raw); err != nil {
		t.Fatal(err)
	}
	var back map[string]string
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back["q"] != "a\x7fb\u0085c" {
		t.Errorf("JSON through the writer: %s → %q, %v", b.Bytes(), back["q"], err)
	}
	if bytes.ContainsAny(b.Bytes(), "\x7f\u0085") {
		t.Errorf("raw controls left in %q", b.Bytes())
	}
}
