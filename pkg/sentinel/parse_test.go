package sentinel_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

func TestResolveContent(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    sentinel.Request // when wantField and wantReason are empty
		field   string           // malformed: the field named
		reason  string           // malformed: part of the reason
	}{
		{name: "minimal", content: `{"question":"A or B?"}`,
			want: sentinel.Request{Question: "A or B?"}},
		{name: "all fields", content: `{"question": "Rewrite function A or B?", "options": ["A", "B"],
 "context": "Same signature, different call sites.",
 "kind": "decision", "partial_state": {"analysis": "…"}}`,
			want: sentinel.Request{
				Question:     "Rewrite function A or B?",
				Options:      []string{"A", "B"},
				Context:      "Same signature, different call sites.",
				Kind:         sentinel.KindDecision,
				PartialState: json.RawMessage(`{"analysis": "…"}`),
			}},
		{name: "question missing", content: `{"options":["A"]}`, field: "question", reason: "required"},
		{name: "question empty", content: `{"question":""}`, field: "question", reason: "must not be empty"},
		{name: "question whitespace only", content: `{"question":" \t\n "}`, field: "question", reason: "must not be empty"},
		{name: "question escaped whitespace only", content: `{"question":"\u0020\n"}`, field: "question", reason: "must not be empty"},
		{name: "question number", content: `{"question":42}`, field: "question", reason: "must be a string"},
		{name: "question null", content: `{"question":null}`, field: "question", reason: "must be a string"},
		{name: "question array", content: `{"question":["a"]}`, field: "question", reason: "must be a string"},
		{name: "question key is case-sensitive", content: `{"Question":"a"}`, field: "question", reason: "required"},
		{name: "question escapes decoded", content: `{"question":"a\u00e9\n\"b\""}`,
			want: sentinel.Request{Question: "a\u00e9\n\"b\""}},
		{name: "options not an array", content: `{"question":"q","options":"A,B"}`, field: "options", reason: "must be an array of strings"},
		{name: "options object", content: `{"question":"q","options":{"0":"A"}}`, field: "options", reason: "must be an array of strings"},
		{name: "options non-string element", content: `{"question":"q","options":["A",2]}`, field: "options[1]", reason: "must be a string"},
		{name: "options null element", content: `{"question":"q","options":["A","B",null]}`, field: "options[2]", reason: "must be a string"},
		{name: "options empty-string element", content: `{"question":"q","options":["A","B",""]}`, field: "options[2]", reason: "must not be empty"},
		{name: "options blank element", content: `{"question":"q","options":["  "]}`, field: "options[0]", reason: "must not be empty"},
		{name: "options empty array", content: `{"question":"q","options":[]}`,
			want: sentinel.Request{Question: "q"}},
		{name: "options null", content: `{"question":"q","options":null}`,
			want: sentinel.Request{Question: "q"}},
		{name: "context number", content: `{"question":"q","context":1}`, field: "context", reason: "must be a string"},
		{name: "context object", content: `{"question":"q","context":{}}`, field: "context", reason: "must be a string"},
		{name: "context null", content: `{"question":"q","context":null}`,
			want: sentinel.Request{Question: "q"}},
		{name: "kind clarification", content: `{"question":"q","kind":"clarification"}`,
			want: sentinel.Request{Question: "q", Kind: sentinel.KindClarification}},
		{name: "kind decision", content: `{"question":"q","kind":"decision"}`,
			want: sentinel.Request{Question: "q", Kind: sentinel.KindDecision}},
		{name: "kind information", content: `{"question":"q","kind":"information"}`,
			want: sentinel.Request{Question: "q", Kind: sentinel.KindInformation}},
		{name: "kind approval", content: `{"question":"q","kind":"approval"}`,
			want: sentinel.Request{Question: "q", Kind: sentinel.KindApproval}},
		{name: "kind invalid", content: `{"question":"q","kind":"opinion"}`, field: "kind", reason: "must be one of"},
		{name: "kind wrong case", content: `{"question":"q","kind":"Decision"}`, field: "kind", reason: "must be one of"},
		{name: "kind empty string", content: `{"question":"q","kind":""}`, field: "kind", reason: "must be one of"},
		{name: "kind number", content: `{"question":"q","kind":1}`, field: "kind", reason: "must be a string"},
		{name: "kind null", content: `{"question":"q","kind":null}`,
			want: sentinel.Request{Question: "q"}},
		{name: "partial_state null", content: `{"question":"q","partial_state":null}`,
			want: sentinel.Request{Question: "q"}},
		{name: "partial_state object", content: `{"question":"q","partial_state":{ "a" : [1, 2.50, "x"] }}`,
			want: sentinel.Request{Question: "q", PartialState: json.RawMessage(`{ "a" : [1, 2.50, "x"] }`)}},
		{name: "partial_state array", content: `{"question":"q","partial_state":[true,false,null]}`,
			want: sentinel.Request{Question: "q", PartialState: json.RawMessage(`[true,false,null]`)}},
		{name: "partial_state string", content: `{"question":"q","partial_state":"step 3 of 7 \u00e9 <b>"}`,
			want: sentinel.Request{Question: "q", PartialState: json.RawMessage(`"step 3 of 7 \u00e9 <b>"`)}},
		{name: "partial_state 1e400", content: `{"question":"q","partial_state":1e400}`,
			want: sentinel.Request{Question: "q", PartialState: json.RawMessage(`1e400`)}},
		{name: "partial_state huge integer", content: `{"question":"q","partial_state":{"id":123456789012345678901234567890}}`,
			want: sentinel.Request{Question: "q", PartialState: json.RawMessage(`{"id":123456789012345678901234567890}`)}},
		{name: "partial_state surrounding whitespace dropped", content: "{\"question\":\"q\",\"partial_state\":  \n 7 \t}",
			want: sentinel.Request{Question: "q", PartialState: json.RawMessage(`7`)}},
		{name: "unknown fields ignored", content: `{"question":"q","extra":{"deep":[1,2]},"version":2,"Options":7}`,
			want: sentinel.Request{Question: "q"}},
		{name: "duplicate field last wins", content: `{"question":1,"question":"second"}`,
			want: sentinel.Request{Question: "second"}},
		{name: "null", content: `null`, reason: "not a JSON object (got null)"},
		{name: "array", content: `[{"question":"q"}]`, reason: "not a JSON object (got array)"},
		{name: "string", content: `"question"`, reason: "not a JSON object (got string)"},
		{name: "number", content: `42`, reason: "not a JSON object (got number)"},
		{name: "boolean", content: `true`, reason: "not a JSON object (got boolean)"},
		{name: "empty file", content: ``, reason: "empty file"},
		{name: "whitespace only", content: " \n\t\r\n", reason: "empty file"},
		{name: "truncated", content: `{"question":"q"`, reason: "invalid JSON: unexpected end of input"},
		{name: "syntax error", content: `{"question":'q'}`, reason: "invalid JSON: invalid character"},
		{name: "trailing garbage", content: `{"question":"q"} x`, reason: "trailing data"},
		{name: "trailing second object", content: `{"question":"q"}{"question":"r"}`, reason: "trailing data"},
		{name: "trailing whitespace ok", content: "{\"question\":\"q\"}\r\n\n ",
			want: sentinel.Request{Question: "q"}},
		{name: "UTF-8 BOM", content: "\xEF\xBB\xBF{\"question\":\"q\"}",
			want: sentinel.Request{Question: "q"}},
		{name: "BOM only", content: "\xEF\xBB\xBF", reason: "empty file"},
		{name: "double BOM", content: "\xEF\xBB\xBF\xEF\xBB\xBF{\"question\":\"q\"}", reason: "invalid JSON"},
		{name: "invalid UTF-8 in question", content: "{\"question\":\"caf\xE9?\"}", field: "question", reason: "invalid UTF-8"},
		{name: "invalid UTF-8 in option", content: "{\"question\":\"q\",\"options\":[\"a\",\"\xFF\"]}", field: "options[1]", reason: "invalid UTF-8"},
		{name: "invalid UTF-8 in context", content: "{\"question\":\"q\",\"context\":\"\xC0\xAF\"}", field: "context", reason: "invalid UTF-8"},
		{name: "invalid UTF-8 in partial_state", content: "{\"question\":\"q\",\"partial_state\":{\"k\":\"\xFE\"}}", field: "partial_state", reason: "invalid UTF-8"},
		{name: "invalid UTF-8 in unknown field ignored", content: "{\"question\":\"q\",\"note\":\"\xFF\"}",
			want: sentinel.Request{Question: "q"}},
		{name: "dedupe_key", content: `{"question":"q","dedupe_key":"config-loader name é"}`,
			want: sentinel.Request{Question: "q", DedupeKey: "config-loader name é"}},
		{name: "dedupe_key null", content: `{"question":"q","dedupe_key":null}`,
			want: sentinel.Request{Question: "q"}},
		{name: "dedupe_key number", content: `{"question":"q","dedupe_key":7}`, field: "dedupe_key", reason: "must be a string"},
		{name: "dedupe_key blank", content: `{"question":"q","dedupe_key":"  "}`, field: "dedupe_key", reason: "must not be blank"},
		{name: "dedupe_key control character", content: `{"question":"q","dedupe_key":"a\nb"}`, field: "dedupe_key", reason: "control characters"},
		{name: "dedupe_key C1 control character", content: `{"question":"q","dedupe_key":"a\u0085b"}`, field: "dedupe_key", reason: "control characters"},
		{name: "dedupe_key 256 bytes", content: `{"question":"q","dedupe_key":"` + strings.Repeat("k", 256) + `"}`,
			want: sentinel.Request{Question: "q", DedupeKey: strings.Repeat("k", 256)}},
		{name: "dedupe_key 257 bytes", content: `{"question":"q","dedupe_key":"` + strings.Repeat("k", 257) + `"}`, field: "dedupe_key", reason: "longer than 256 bytes"},
		{name: "reuse false", content: `{"question":"q","reuse":false}`,
			want: sentinel.Request{Question: "q", Reuse: new(bool)}},
		{name: "reuse null", content: `{"question":"q","reuse":null}`,
			want: sentinel.Request{Question: "q"}},
		{name: "reuse string", content: `{"question":"q","reuse":"no"}`, field: "reuse", reason: "must be true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := writeRaw(t, []byte(tt.content))
			res := resolve(t, ws)
			if res.Size != int64(len(tt.content)) {
				t.Errorf("Size = %d, want %d", res.Size, len(tt.content))
			}
			if tt.field != "" || tt.reason != "" {
				wantMalformed(t, res, tt.field, tt.reason)
				return
			}
			if res.Status != sentinel.Valid || res.Err != nil {
				t.Fatalf("Status = %v, Err = %v; want valid", res.Status, res.Err)
			}
			if !reflect.DeepEqual(res.Request, tt.want) {
				t.Errorf("Request = %#v\nwant      %#v", res.Request, tt.want)
			}
			// Parse agrees with Resolve.
			req, err := sentinel.Parse([]byte(tt.content))
			if err != nil || !reflect.DeepEqual(req, tt.want) {
				t.Errorf("Parse = %#v, %v", req, err)
			}
		})
	}
}

func TestParsePartialStateBytesPreserved(t *testing.T) {
	for _, lit := range []string{
		`1e400`,
		`123456789012345678901234567890`,
		`-0.000000000000000000000000000001`,
		`{"n":1E+2,"m":1.0,"s":"\u00e9\/"}`,
		"[\n  1,\n  2\n]",
	} {
		t.Run(lit, func(t *testing.T) {
			req, err := sentinel.Parse([]byte(`{"question":"q","partial_state":` + lit + `}`))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(req.PartialState, []byte(lit)) {
				t.Errorf("PartialState = %q, want exactly %q", req.PartialState, lit)
			}
		})
	}
}

func TestParseErrorMessages(t *testing.T) {
	tests := []struct {
		content string
		want    string
	}{
		{`{"question":"q","options":["A",1]}`, "sentinel: malformed: options[1]: must be a string"},
		{`{"question":""}`, "sentinel: malformed: question: must not be empty"},
		{`{}`, "sentinel: malformed: question: required"},
		{`[]`, "sentinel: malformed: not a JSON object (got array)"},
		{``, "sentinel: malformed: empty file"},
	}
	for _, tt := range tests {
		_, err := sentinel.Parse([]byte(tt.content))
		var me *sentinel.MalformedError
		if !errors.As(err, &me) {
			t.Fatalf("Parse(%q) error = %T %v, want *MalformedError", tt.content, err, err)
		}
		if err.Error() != tt.want {
			t.Errorf("Parse(%q) error = %q, want %q", tt.content, err.Error(), tt.want)
		}
	}
}

func TestSyntaxErrorOffsetCountsBOM(t *testing.T) {
	_, err := sentinel.Parse([]byte("\xEF\xBB\xBF{\"question\":x}"))
	if err == nil || !strings.Contains(err.Error(), "offset 16") {
		t.Errorf("error = %v, want offset 16 (counted from the start of the file)", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		req   sentinel.Request
		field string // "" means valid
	}{
		{"minimal", sentinel.Request{Question: "q"}, ""},
		{"all fields", sentinel.Request{Question: "q", Options: []string{"a"}, Context: "c", Kind: sentinel.KindApproval, PartialState: json.RawMessage(`{"a":1}`)}, ""},
		{"empty kind allowed", sentinel.Request{Question: "q", Kind: ""}, ""},
		{"empty options allowed", sentinel.Request{Question: "q", Options: []string{}}, ""},
		{"null partial state allowed", sentinel.Request{Question: "q", PartialState: json.RawMessage(`null`)}, ""},
		{"padded partial state allowed", sentinel.Request{Question: "q", PartialState: json.RawMessage(" 1 ")}, ""},
		{"question empty", sentinel.Request{}, "question"},
		{"question blank", sentinel.Request{Question: "\n\t "}, "question"},
		{"question invalid UTF-8", sentinel.Request{Question: "\xff"}, "question"},
		{"option empty", sentinel.Request{Question: "q", Options: []string{"a", "b", ""}}, "options[2]"},
		{"option invalid UTF-8", sentinel.Request{Question: "q", Options: []string{"\xc3"}}, "options[0]"},
		{"context invalid UTF-8", sentinel.Request{Question: "q", Context: "\x80"}, "context"},
		{"kind invalid", sentinel.Request{Question: "q", Kind: "urgent"}, "kind"},
		{"partial state not JSON", sentinel.Request{Question: "q", PartialState: json.RawMessage(`{a:1}`)}, "partial_state"},
		{"partial state two values", sentinel.Request{Question: "q", PartialState: json.RawMessage(`1 2`)}, "partial_state"},
		{"partial state invalid UTF-8", sentinel.Request{Question: "q", PartialState: json.RawMessage("\"\xff\"")}, "partial_state"},
		{"dedupe key", sentinel.Request{Question: "q", DedupeKey: "loader"}, ""},
		{"dedupe key blank", sentinel.Request{Question: "q", DedupeKey: " "}, "dedupe_key"},
		{"dedupe key too long", sentinel.Request{Question: "q", DedupeKey: strings.Repeat("x", sentinel.MaxDedupeKey+1)}, "dedupe_key"},
		{"dedupe key control character", sentinel.Request{Question: "q", DedupeKey: "a\tb"}, "dedupe_key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var me *sentinel.MalformedError
			if !errors.As(err, &me) {
				t.Fatalf("Validate() = %T %v, want *MalformedError", err, err)
			}
			if me.Field != tt.field {
				t.Errorf("Field = %q, want %q", me.Field, tt.field)
			}
		})
	}
}

func TestKindValid(t *testing.T) {
	tests := []struct {
		kind sentinel.Kind
		want bool
	}{
		{sentinel.KindClarification, true},
		{sentinel.KindDecision, true},
		{sentinel.KindInformation, true},
		{sentinel.KindApproval, true},
		{"", false},
		{"Decision", false},
		{"other", false},
	}
	for _, tt := range tests {
		if got := tt.kind.Valid(); got != tt.want {
			t.Errorf("Kind(%q).Valid() = %v, want %v", tt.kind, got, tt.want)
		}
	}
}

func TestStatusString(t *testing.T) {
	tests := []struct {
		s    sentinel.Status
		want string
	}{
		{sentinel.Absent, "absent"},
		{sentinel.Valid, "valid"},
		{sentinel.Malformed, "malformed"},
		{sentinel.Oversized, "oversized"},
		{sentinel.Status(9), "Status(9)"},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("Status(%d).String() = %q, want %q", int(tt.s), got, tt.want)
		}
	}
}

// Nesting is bounded before anything decodes the file: 64 levels, the top
// object counted, and brackets inside strings are text.
func TestParseNestingDepth(t *testing.T) {
	nested := func(levels int) string { // partial_state nested so the file is levels deep
		return `{"question":"q?","partial_state":` + strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`
	}
	for _, c := range []struct {
		name string
		file string
		ok   bool
	}{
		{"at the limit", nested(sentinel.MaxDepth), true},
		{"one past the limit", nested(sentinel.MaxDepth + 1), false},
		{"an indentation bomb", nested(9990), false},
		{"brackets in strings", `{"question":"` + strings.Repeat("[{", 5000) + `","partial_state":{"s":"` + strings.Repeat("[", 9000) + `"}}`, true},
		{"escaped quotes in strings", `{"question":"a \"[[[[\" b","context":"\\","partial_state":[[1]]}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := sentinel.Parse([]byte(c.file))
			var me *sentinel.MalformedError
			switch {
			case c.ok && err != nil:
				t.Fatalf("Parse: %v, want accepted", err)
			case !c.ok && (!errors.As(err, &me) || !strings.Contains(err.Error(), "the limit is 64")):
				t.Fatalf("Parse: %v, want malformed naming the limit", err)
			}
		})
	}
}
