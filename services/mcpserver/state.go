package mcpserver

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
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
	ID         string    `json:"id"`
	Principal  string    `json:"principal"`
	ThreadID   string    `json:"thread_id"`
	QuestionID string    `json:"question_id"`
	Kind       string    `json:"kind,omitempty"` // the question's kind, to read the answer form
	Expires    time.Time `json:"exp"`
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
type sealer struct{ aead cipher.AEAD }

func newSealer(key []byte) (*sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("mcpserver: the state key is %d bytes; want 32", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

// seal returns the sealed form of st: "v1." + base64url(nonce ‖ ciphertext).
// The version is authenticated as additional data.
func (s *sealer) seal(st state) (string, error) {
	plain, err := json.Marshal(st)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := s.aead.Seal(nonce, nonce, plain, []byte(stateVersion))
	return stateVersion + base64.RawURLEncoding.EncodeToString(out), nil
}

// open verifies and decodes a sealed state for principal at now. It does
// not consume it.
func (s *sealer) open(sealed, principal string, now time.Time) (state, error) {
	if len(sealed) <= len(stateVersion) || sealed[:len(stateVersion)] != stateVersion {
		return state{}, errStateInvalid
	}
	raw, err := base64.RawURLEncoding.DecodeString(sealed[len(stateVersion):])
	if err != nil || len(raw) < s.aead.NonceSize() {
		return state{}, errStateInvalid
	}
	plain, err := s.aead.Open(nil, raw[:s.aead.NonceSize()], raw[s.aead.NonceSize():], []byte(stateVersion))
	if err != nil {
		return state{}, errStateInvalid
	}
	var st state
	if err := json.Unmarshal(plain, &st); err != nil || st.ID == "" || st.ThreadID == "" || st.QuestionID == "" {
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
func newStateID() string {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
