package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/seal"
)

// The requestState of an input-required result is input the client echoes
// back, so it is attacker-controlled: it is sealed (AES-256-GCM under the
// server's key), bound to the principal that was asked and to the
// question, expires, and is consumed once (docs/mcp.md).

// stateVersion prefixes a sealed state; a state of another version is
// refused.
const stateVersion = "v1."

// state is what a requestState carries.
type state struct {
	// ID is random; consuming the state creates this key in
	// agora_mcp_states, so a second use is refused.
	ID         string `json:"id"`
	Principal  string `json:"principal"`
	ThreadID   string `json:"thread_id"`
	QuestionID string `json:"question_id"`
	Kind       string `json:"kind,omitempty"` // the question's kind, to read the answer form
	// Shown is the shown digest of the question as the form asked it;
	// the answer carries it (docs/mcp.md, "Bound answers").
	Shown   string    `json:"shown,omitempty"`
	Expires time.Time `json:"exp"`
}

// Errors a requestState can fail with. Each is a tool error whose text
// says what to do next; none changes anything.
var (
	errStateInvalid  = errors.New("the requestState is not one this server issued (tampered, truncated or from another server)")
	errStateExpired  = errors.New("the requestState has expired")
	errStateForeign  = errors.New("the requestState was issued to another principal")
	errStateReplayed = errors.New("the requestState was already used")
)

// sealer seals and opens request states with one key.
type sealer struct{ s *seal.Sealer }

func newSealer(key []byte) (*sealer, error) {
	s, err := seal.New(key, stateVersion)
	if err != nil {
		return nil, fmt.Errorf("mcpserver: state key: %w", err)
	}
	return &sealer{s: s}, nil
}

// seal returns the sealed form of st: "v1." + base64url(nonce ‖ ciphertext).
// The version is authenticated as additional data.
func (s *sealer) seal(st state) (string, error) { return s.s.Seal(st) }

// open verifies and decodes a sealed state for principal at now. It does
// not consume it.
func (s *sealer) open(sealed, principal string, now time.Time) (state, error) {
	var st state
	if err := s.s.Open(sealed, &st); err != nil || st.ID == "" || st.ThreadID == "" || st.QuestionID == "" {
		return state{}, errStateInvalid
	}
	if st.Principal != principal {
		return state{}, errStateForeign
	}
	if !now.Before(st.Expires) {
		return state{}, errStateExpired
	}
	return st, nil
}

// consume marks st used by creating its key in agora_mcp_states; a key
// that exists already means the state was used before. The bucket's
// MaxAge outlives every state, so a used state cannot come back.
func consume(ctx context.Context, kv jetstream.KeyValue, st state) error {
	_, err := kv.Create(ctx, st.ID, []byte(st.QuestionID))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return errStateReplayed
	}
	if err != nil {
		return fmt.Errorf("mcpserver: record the use of a request state in %s: %w", lifecycle.BucketMCPStates, err)
	}
	return nil
}

// newStateID returns a random state id (a valid KV key).
func newStateID() string { return seal.RandomID() }
