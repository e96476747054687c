package sentinel_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

// FuzzParse checks that Parse never panics, reports failures as
// *MalformedError, and that whatever it accepts survives Write and Resolve
// unchanged.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		``,
		`null`,
		`[]`,
		`{}`,
		`{"question":"q"}`,
		`{"question":" "}`,
		"\xEF\xBB\xBF{\"question\":\"q\"}",
		`{"question":"q","options":["A","B"],"context":"c","kind":"decision","partial_state":{"a":[1,2]}}`,
		`{"question":"q","options":[]}`,
		`{"question":"q","options":null,"context":null,"kind":null,"partial_state":null}`,
		`{"question":"q","partial_state":1e400}`,
		`{"question":"q","partial_state": 123456789012345678901234567890 }`,
		`{"question":"q","partial_state":"<&>\u2028"}`,
		`{"question":"\ud800","options":["\udc00"]}`,
		"{\"question\":\"\xff\"}",
		`{"question":"q"} trailing`,
		`{"question":"q","question":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := sentinel.Parse(b)
		if err != nil {
			var me *sentinel.MalformedError
			if !errors.As(err, &me) {
				t.Fatalf("Parse error = %T %v, want *MalformedError", err, err)
			}
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("Parse accepted a request that Validate refuses: %v\n%#v", err, req)
		}
		ws := t.TempDir()
		if err := sentinel.Write(ws, req); err != nil {
			var oe *sentinel.OversizedError
			if errors.As(err, &oe) {
				return // re-encoding can grow a file near the limit
			}
			t.Fatalf("Write: %v", err)
		}
		res := resolve(t, ws)
		if res.Status != sentinel.Valid {
			t.Fatalf("Resolve after Write: %v %v", res.Status, res.Err)
		}
		if !reflect.DeepEqual(res.Request, req) {
			t.Fatalf("round trip changed the request:\n got %#v\nwant %#v", res.Request, req)
		}
	})
}

// FuzzWriteResolve checks that any request Validate accepts is written and
// read back exactly, after the documented normalisation. options holds the
// options separated by NUL; an empty partialState means none.
func FuzzWriteResolve(f *testing.F) {
	f.Add("A or B?", "A\x00B", "context", "decision", `{"a":1}`)
	f.Add("q", "", "", "", "")
	f.Add(" q ", "\x00", "", "approval", " null ")
	f.Add("<q> & \u2028", "é", "\n\t", "information", "\n1e400 ")
	f.Add("q", "x", "c", "bogus", `[1, 2, {"k": "<v>"}]`)
	f.Add("\xff", "", "", "", "")
	f.Add("q", "", "", "", `123456789012345678901234567890`)
	f.Fuzz(func(t *testing.T, question, options, context, kind, partialState string) {
		req := sentinel.Request{
			Question: question,
			Context:  context,
			Kind:     sentinel.Kind(kind),
		}
		if options != "" {
			req.Options = strings.Split(options, "\x00")
		}
		if partialState != "" {
			req.PartialState = json.RawMessage(partialState)
		}
		ws := t.TempDir()
		verr := req.Validate()
		werr := sentinel.Write(ws, req)
		if verr != nil {
			var me *sentinel.MalformedError
			if !errors.As(werr, &me) {
				t.Fatalf("Validate = %v but Write = %v; want a *MalformedError", verr, werr)
			}
			return
		}
		if werr != nil {
			t.Fatalf("Validate passed but Write = %v", werr)
		}
		res := resolve(t, ws)
		if res.Status != sentinel.Valid {
			t.Fatalf("Resolve after Write: %v %v", res.Status, res.Err)
		}
		if want := normalised(req); !reflect.DeepEqual(res.Request, want) {
			t.Fatalf("round trip changed the request:\n got %#v\nwant %#v", res.Request, want)
		}
	})
}

// normalised applies the normalisation Write documents: empty options and
// a null partial state are omitted, whitespace around the state dropped.
func normalised(r sentinel.Request) sentinel.Request {
	if len(r.Options) == 0 {
		r.Options = nil
	}
	state := strings.Trim(string(r.PartialState), " \t\r\n")
	if state == "" || state == "null" {
		r.PartialState = nil
	} else {
		r.PartialState = json.RawMessage(state)
	}
	return r
}
