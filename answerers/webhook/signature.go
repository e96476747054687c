package webhook

import (
	"time"

	"github.com/agora-dispatch/agora/internal/hook"
)

// SignatureHeader carries a POST's signature: t=<unix seconds>,v1=<hex of
// HMAC-SHA256(secret, "<t>.<body>")> (docs/webhook.md).
const SignatureHeader = hook.SignatureHeader

// EventIDHeader carries the question id, the same on every retry, so a
// receiver can drop a repeat.
const EventIDHeader = hook.EventIDHeader

// Sign returns the signature header value of body at t.
func Sign(secret string, body []byte, t time.Time) string { return hook.Sign(secret, body, t) }

// Errors of Verify.
var (
	ErrMalformed = hook.ErrMalformed
	ErrStale     = hook.ErrStale
	ErrMismatch  = hook.ErrMismatch
)

// Verify checks a POST as a receiver should: the header's timestamp within
// tolerance of now (against replays), and one of its v1 signatures equal,
// in constant time, to the HMAC of "<t>.<body>" under secret.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	return hook.Verify(secret, header, body, now, tolerance)
}
