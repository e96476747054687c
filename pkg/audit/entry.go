// Package audit is Agora's tamper-evident decision log in its portable
// form: the entry, its canonical encoding and hash, the chain that links
// each entry to the one before it, signed checkpoints, and the verifier
// of an export. It uses only the standard library, so a program outside
// Agora can check a log with it; docs/audit.md states the same rules
// precisely enough to check one in another language
// (examples/audit/verify.py).
package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Entry kinds. Every step a person's attention touches is one entry; a
// timeout is an entry of its own kind (expired), never an answer.
const (
	KindAsked      = "asked"     // a question was put to a route
	KindEscalated  = "escalated" // it moved to another route
	KindJoined     = "joined"    // it joined a matching question asked earlier
	KindAnswered   = "answered"  // an answer was accepted
	KindExpired    = "expired"   // its deadline passed; action says what followed
	KindWithdrawn  = "withdrawn" // its thread was cancelled while it waited
	KindCancelled  = "cancelled" // a dispatch was cancelled (lifecycle event)
	KindRefused    = "refused"   // a worker refused a dispatch below the operator's sandbox floor
	KindReversed   = "reversed"  // a person reversed an accepted suggestion
	KindGap        = "gap"       // source events were removed before the log read them
	KindCheckpoint = "checkpoint"
)

// Genesis is the prev_hash of the first entry.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// Entry is one line of the log. Every field is a string, an integer or a
// boolean (no floats, so every language encodes it alike); empty fields
// are left out. Seq, Kind, At, PrevHash and Hash are always present.
type Entry struct {
	Seq      int64  `json:"seq"`       // 1 for the first entry, then +1 each
	Kind     string `json:"kind"`      // one of the Kind constants
	At       string `json:"at"`        // RFC 3339 UTC: when the step happened
	PrevHash string `json:"prev_hash"` // Hash of entry Seq-1; Genesis for the first
	Hash     string `json:"hash"`      // HashObject of this entry

	// Source is the event the entry was derived from: its stream, stream
	// sequence and CloudEvent id.
	Source    string `json:"source,omitempty"`
	SourceSeq int64  `json:"source_seq,omitempty"`
	SourceID  string `json:"source_id,omitempty"`
	// The writer's cursors: the last sequence of each source stream it
	// has consumed through, with this entry.
	CursorQuestions int64 `json:"cursor_questions"`
	CursorLifecycle int64 `json:"cursor_lifecycle"`

	// Who and where.
	QuestionID string `json:"question_id,omitempty"`
	Route      string `json:"route,omitempty"`
	Subagent   string `json:"subagent,omitempty"`
	ThreadID   string `json:"thread_id,omitempty"`
	DispatchID string `json:"dispatch_id,omitempty"`
	Round      int    `json:"round,omitempty"`
	Escalation int    `json:"escalation,omitempty"`

	// What was shown (asked, escalated, answered): ShownDigest is the Digest of the
	// canonical encoding of {"context","kind","options","partial_state",
	// "question"}, partial_state being PartialStateDigest (never the
	// state itself).
	ShownDigest        string `json:"shown_digest,omitempty"`
	PartialStateDigest string `json:"partial_state_digest,omitempty"`
	// BoundDigest (answered) is the shown digest the accepted answer was
	// bound to: the one its door showed, or, for an answer from memory,
	// the one the remembered decision was made on; absent when the answer
	// came without one (not bound: it answered the question as it stood).
	// An answered entry's ShownDigest is what the question showed then.
	BoundDigest string `json:"bound_digest,omitempty"`

	// The answer (answered; expired with a default). AnsweredBy is who;
	// Door the way it came (api, api-route, stream, memory, suggestion,
	// expiry-default); Reused* name a remembered decision reused;
	// Suggestion* an accepted suggestion (confidence as a decimal string).
	AnsweredBy           string `json:"answered_by,omitempty"`
	Door                 string `json:"door,omitempty"`
	Answer               string `json:"answer,omitempty"`
	Decision             string `json:"decision,omitempty"`
	Comment              string `json:"comment,omitempty"`
	ReusedQuestionID     string `json:"reused_question_id,omitempty"`
	ReusedAnsweredBy     string `json:"reused_answered_by,omitempty"`
	SuggestionBy         string `json:"suggestion_by,omitempty"`
	SuggestionConfidence string `json:"suggestion_confidence,omitempty"`

	// What followed. JoinedTo: the question a joined one waits on.
	// Action: an expiry's on_expiry (fail, cancel, default:<option>).
	// Outcome: how the thread went on (redispatched, failed:unanswered,
	// failed:max-rounds, cancelled, withdrawn). NextDispatchID: the
	// dispatch the step resumed, or the one that records the thread's end.
	JoinedTo string `json:"joined_to,omitempty"`
	// A reversal: the suggestion's answer it replaced and the resumed
	// dispatch it cancelled (NextDispatchID is the new one).
	ReversedAnswer      string `json:"reversed_answer,omitempty"`
	CancelledDispatchID string `json:"cancelled_dispatch_id,omitempty"`
	Action              string `json:"action,omitempty"`
	Outcome             string `json:"outcome,omitempty"`
	NextDispatchID      string `json:"next_dispatch_id,omitempty"`
	Detail              string `json:"detail,omitempty"`
	// RecordMissing is set when the question record the entry completes
	// its event with (comment, door, outcome, partial state digest) had
	// expired before the writer read it.
	RecordMissing bool `json:"record_missing,omitempty"`

	// A cancel: who and why.
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`

	// A gap: Source names the stream, GapFrom..GapTo the sequences missing.
	GapFrom int64 `json:"gap_from,omitempty"`
	GapTo   int64 `json:"gap_to,omitempty"`

	// A checkpoint: HeadHash is the hash of entry Seq-1 (its PrevHash),
	// Count how many entries precede it; Signature, when the writer has a
	// key, the base64 Ed25519 signature of CheckpointMessage, by the key
	// whose KeyID is given.
	HeadHash  string `json:"head_hash,omitempty"`
	Count     int64  `json:"count,omitempty"`
	Signature string `json:"signature,omitempty"`
	KeyID     string `json:"key_id,omitempty"`
}

// object is e as a JSON object, numbers exact.
func (e *Entry) object() (map[string]any, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	cp := *e
	cleanStrings(&cp)
	if err := enc.Encode(&cp); err != nil {
		return nil, err
	}
	return decodeObject(buf.Bytes())
}

// Seal sets e.Hash from the rest of e (e.PrevHash included) and returns
// the entry's canonical encoding with its hash: the line the log stores
// and exports.
func (e *Entry) Seal() ([]byte, error) {
	obj, err := e.object()
	if err != nil {
		return nil, fmt.Errorf("audit: entry %d: %w", e.Seq, err)
	}
	h, err := HashObject(obj)
	if err != nil {
		return nil, fmt.Errorf("audit: entry %d: %w", e.Seq, err)
	}
	e.Hash = h
	obj["hash"] = h
	return Canonical(obj)
}

// Parse decodes one stored or exported line.
func Parse(line []byte) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(line, &e); err != nil {
		return Entry{}, fmt.Errorf("audit: decode entry: %w", err)
	}
	return e, nil
}

// CheckpointMessage is what a checkpoint's signature signs: the ASCII
// text "agora-audit-checkpoint <count> <head_hash>".
func CheckpointMessage(count int64, headHash string) []byte {
	return fmt.Appendf(nil, "agora-audit-checkpoint %d %s", count, headHash)
}

func cleanStrings(e *Entry) {
	for _, p := range []*string{&e.Kind, &e.At, &e.PrevHash, &e.Source, &e.SourceID, &e.QuestionID, &e.Route,
		&e.Subagent, &e.ThreadID, &e.DispatchID, &e.ShownDigest, &e.PartialStateDigest, &e.BoundDigest, &e.AnsweredBy, &e.Door,
		&e.Answer, &e.Decision, &e.Comment, &e.ReusedQuestionID, &e.ReusedAnsweredBy, &e.SuggestionBy,
		&e.SuggestionConfidence, &e.JoinedTo, &e.ReversedAnswer, &e.CancelledDispatchID, &e.Action, &e.Outcome, &e.NextDispatchID, &e.Detail, &e.By,
		&e.Reason, &e.HeadHash, &e.Signature, &e.KeyID} {
		*p = clean(*p)
	}
}

// Link makes e the entry after prev, nil for the first: it sets Seq and
// PrevHash. Seal e after.
func (e *Entry) Link(prev *Entry) {
	if prev == nil {
		e.Seq, e.PrevHash = 1, Genesis
		return
	}
	e.Seq, e.PrevHash = prev.Seq+1, prev.Hash
}

// The log's stream and subject (provisioned by Agora; docs/audit.md).
const (
	Stream  = "AGORA_AUDIT"
	Subject = "agora.audit"
)
