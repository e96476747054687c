// Package sentinel implements the needs_input sentinel contract
// (docs/wire.md, "The sentinel file").
//
// A sub-agent that must ask a question instead of guessing writes a JSON
// object to <workspace>/.agora/needs_input.json and exits. After the runtime
// exits, the worker calls [Resolve] to classify the file as absent, valid,
// malformed or oversized, and publishes the matching lifecycle event.
//
// Everything in the file is controlled by the sub-agent, so [Resolve] treats
// it as hostile input: it never follows a symlink, never blocks on a FIFO,
// never reads more than [MaxSize]+1 bytes, and reports every problem the
// sub-agent caused as a [Resolution] rather than as an error. [Write] is the
// other side of the contract, for helpers and tests that produce a sentinel.
//
// The package imports nothing but the standard library. Its functions hold
// no shared state and are safe for concurrent use; concurrent [Write] calls
// to the same workspace leave one complete file (the last rename wins).
package sentinel

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
)

// RelPath is the sentinel's path relative to the workspace. The worker
// passes the absolute form, [Path], to the sub-agent in
// AGORA_NEEDS_INPUT_FILE.
const RelPath = ".agora/needs_input.json"

// MaxSize is the largest sentinel file accepted, in bytes (1 MiB). A file of
// MaxSize bytes is accepted; one byte more is [Oversized].
const MaxSize = 1 << 20

// Kind classifies a question so that routes and answerers can treat, for
// example, an approval differently from a request for information.
type Kind string

// The four kinds of question. A request may also leave Kind empty.
const (
	// KindClarification asks what an ambiguous instruction means.
	KindClarification Kind = "clarification"
	// KindDecision asks the answerer to choose, usually among Options.
	KindDecision Kind = "decision"
	// KindInformation asks for a fact the sub-agent cannot find itself.
	KindInformation Kind = "information"
	// KindApproval asks for permission; the answer carries a decision.
	KindApproval Kind = "approval"
)

// Valid reports whether k is one of the four kinds. The empty Kind is not
// valid here, although [Request.Validate] accepts a request without a kind.
func (k Kind) Valid() bool {
	switch k {
	case KindClarification, KindDecision, KindInformation, KindApproval:
		return true
	}
	return false
}

// Request is the content of a sentinel file: the question a sub-agent asks
// and the state it wants back when it is resumed with the answer.
//
// A Request returned by [Parse] or [Resolve] is normalised: Options is nil
// or non-empty, and PartialState is nil or the exact bytes of a JSON value
// other than null, without surrounding whitespace.
type Request struct {
	// Question is required and is not blank.
	Question string `json:"question"`
	// Options, when non-empty, are the only acceptable answers; none means
	// a free-text answer. Each option is a non-blank string.
	Options []string `json:"options,omitempty"`
	// Context is optional background shown with the question.
	Context string `json:"context,omitempty"`
	// Kind is empty or one of the four kinds.
	Kind Kind `json:"kind,omitempty"`
	// PartialState is any JSON value, kept byte for byte (numbers are never
	// converted), returned to the sub-agent when it is resumed.
	PartialState json.RawMessage `json:"partial_state,omitempty"`
	// DedupeKey, when set, is what makes two questions the same one: a
	// question joins one still waiting on the same route with the same
	// key, and a remembered decision with that key answers it
	// (docs/router.md, "Ask once"). Without it, questions match on sub-agent,
	// question, options and kind. At most [MaxDedupeKey] bytes of
	// printable text.
	DedupeKey string `json:"dedupe_key,omitempty"`
	// Reuse false asks for a fresh answer: the question is never answered
	// from a remembered decision. Nil (absent) and true allow reuse where
	// the route remembers.
	Reuse *bool `json:"reuse,omitempty"`
}

// MaxDedupeKey is the longest dedupe_key accepted, in bytes.
const MaxDedupeKey = 256

// MaxDepth is how deeply a sentinel's arrays and objects may nest, the top
// object counted (so partial_state may nest 63 levels): a deeper file is
// [Malformed]. Every reader of a question and its state — the router, the
// inbox, the CLI, clients in other languages — then renders a bounded
// structure.
const MaxDepth = 64

// Status is the outcome of [Resolve].
type Status int

const (
	// Absent means no sentinel file exists (nor its .agora directory).
	Absent Status = iota
	// Valid means the file holds a valid [Request].
	Valid
	// Malformed means the path exists but is not a regular file, or its
	// content breaks a rule; the Resolution's Err is a *[MalformedError].
	Malformed
	// Oversized means the file is larger than [MaxSize]; the Resolution's
	// Err is an *[OversizedError].
	Oversized
)

// String returns "absent", "valid", "malformed" or "oversized".
func (s Status) String() string {
	switch s {
	case Absent:
		return "absent"
	case Valid:
		return "valid"
	case Malformed:
		return "malformed"
	case Oversized:
		return "oversized"
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Resolution describes what [Resolve] found at the sentinel path.
type Resolution struct {
	// Status is the classification.
	Status Status
	// Request is the parsed sentinel; set only when Status is Valid.
	Request Request
	// Size is the number of bytes seen. For Oversized it is the file size
	// reported by the file system, or MaxSize+1 when the file grew while it
	// was read; it is 0 when nothing was read.
	Size int64
	// Err is a *MalformedError when Status is Malformed, an *OversizedError
	// when Status is Oversized, and nil otherwise.
	Err error
}

// MalformedError reports a sentinel that breaks a rule of the contract.
type MalformedError struct {
	// Field names the offending field, such as "question" or "options[1]";
	// it is empty when the problem concerns the whole file.
	Field string
	// Reason says what is wrong, in lowercase.
	Reason string
}

// Error returns, for example, "sentinel: malformed: options[1]: must be a
// string" or "sentinel: malformed: not a regular file (symlink)".
func (e *MalformedError) Error() string {
	if e.Field == "" {
		return "sentinel: malformed: " + e.Reason
	}
	return "sentinel: malformed: " + e.Field + ": " + e.Reason
}

// OversizedError reports a sentinel larger than the limit.
type OversizedError struct {
	// Size is the size seen, in bytes.
	Size int64
	// Limit is the largest size accepted, [MaxSize].
	Limit int64
}

// Error returns, for example, "sentinel: oversized: 1048577 bytes, limit
// 1048576".
func (e *OversizedError) Error() string {
	return fmt.Sprintf("sentinel: oversized: %d bytes, limit %d", e.Size, e.Limit)
}

// Path returns the sentinel's path inside workspace,
// filepath.Join(workspace, RelPath).
func Path(workspace string) string {
	return filepath.Join(workspace, RelPath)
}
