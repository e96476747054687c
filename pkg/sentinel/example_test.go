package sentinel_test

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

// A sub-agent asks a question by writing the sentinel; after it exits, the
// worker resolves the file.
func ExampleWrite() {
	ws, err := os.MkdirTemp("", "workspace")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(ws)

	err = sentinel.Write(ws, sentinel.Request{
		Question:     "Rewrite function A or B?",
		Options:      []string{"A", "B"},
		Kind:         sentinel.KindDecision,
		PartialState: json.RawMessage(`{"analysed":["a.go","b.go"],"hash":123456789012345678901234567890}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	res, err := sentinel.Resolve(ws)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Status)
	fmt.Println(res.Request.Question, res.Request.Options, res.Request.Kind)
	fmt.Println(string(res.Request.PartialState))

	// A request that breaks a rule is refused before anything is written.
	err = sentinel.Write(ws, sentinel.Request{Question: "Which?", Options: []string{"A", ""}})
	fmt.Println(err)
	// Output:
	// valid
	// Rewrite function A or B? [A B] decision
	// {"analysed":["a.go","b.go"],"hash":123456789012345678901234567890}
	// sentinel: malformed: options[1]: must not be empty
}

// Resolve reports a missing sentinel as Absent, not as an error.
func ExampleResolve() {
	ws, err := os.MkdirTemp("", "workspace")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(ws)

	res, err := sentinel.Resolve(ws)
	fmt.Println(res.Status, err)
	// Output: absent <nil>
}
