// Package seal seals small values into URL-safe tokens that only the
// holder of the key can make or read: AES-256-GCM under a 32-byte key, a
// random nonce per token, and a version prefix authenticated as additional
// data, so a token made for one purpose (an MCP requestState, an answer
// link) does not open as another even under the same key
// (docs/mcp.md, docs/inbox.md). It imports nothing of Agora.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// KeySize is the length of a key in bytes.
const KeySize = 32

// ErrInvalid is returned by Open for a token this key did not seal:
// tampered, truncated, of another version, or sealed under another key.
var ErrInvalid = errors.New("seal: not a token sealed by this key")

// Sealer seals and opens tokens with one key and one version prefix. It is
// safe for concurrent use.
type Sealer struct {
	aead    cipher.AEAD
	version string
}

// New returns a Sealer for key (KeySize bytes). version prefixes every
// token (e.g. "v1.") and is authenticated with it.
func New(key []byte, version string) (*Sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("seal: the key is %d bytes; want %d", len(key), KeySize)
	}
	if version == "" {
		return nil, errors.New("seal: the version prefix is empty")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead, version: version}, nil
}

// Seal returns version + base64url(nonce ‖ ciphertext) of v's JSON.
func (s *Sealer) Seal(v any) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	nonce := make([]byte, s.aead.NonceSize())
	_, _ = rand.Read(nonce) // never fails (crypto/rand)
	out := s.aead.Seal(nonce, nonce, plain, []byte(s.version))
	return s.version + base64.RawURLEncoding.EncodeToString(out), nil
}

// Open verifies token and decodes its JSON into v. Any failure is
// ErrInvalid: a caller learns nothing about why a forged token failed.
func (s *Sealer) Open(token string, v any) error {
	rest, ok := strings.CutPrefix(token, s.version)
	if !ok || rest == "" {
		return ErrInvalid
	}
	raw, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(raw) < s.aead.NonceSize() {
		return ErrInvalid
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], []byte(s.version))
	if err != nil {
		return ErrInvalid
	}
	if err := json.Unmarshal(plain, v); err != nil {
		return ErrInvalid
	}
	return nil
}

// DecodeKey reads a key written in base64 (standard or URL alphabet, with
// or without padding). The error says how to make a good one.
func DecodeKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			if len(b) != KeySize {
				return nil, fmt.Errorf("the key is %d bytes; want %d (e.g. `openssl rand -base64 32`)", len(b), KeySize)
			}
			return b, nil
		}
	}
	return nil, errors.New("not base64; want 32 random bytes in base64 (e.g. `openssl rand -base64 32`)")
}

// NewKey returns a new random key in base64, as DecodeKey reads it.
func NewKey() string {
	b := make([]byte, KeySize)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// RandomID returns a random identifier (18 bytes, base64url): a valid
// NATS KV key, for recording that a token was used.
func RandomID() string {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
