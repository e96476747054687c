// Package hook signs and sends the POSTs Agora makes to URLs outside it:
// the webhook notifier's questions (docs/webhook.md) and the A2A server's
// push notifications (docs/a2a.md). Every POST carries X-Agora-Event-Id
// (the same on every retry) and X-Agora-Signature:
// t=<unix seconds>,v1=<hex of HMAC-SHA256(secret, "<t>.<body>")>.
// A redirect is never followed, a 408, 429 or 5xx is worth a retry, and
// the wait between attempts doubles up to MaxBackoff.
package hook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries a POST's signature: t=<unix seconds>,v1=<hex of
// HMAC-SHA256(secret, "<t>.<body>")> (docs/webhook.md).
const SignatureHeader = "X-Agora-Signature"

// EventIDHeader carries the event's id, the same on every retry, so a
// receiver can drop a repeat.
const EventIDHeader = "X-Agora-Event-Id"

// Sign returns the signature header value of body at t.
func Sign(secret string, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret, ts string, body []byte) string {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts))
	h.Write([]byte("."))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Errors of Verify.
var (
	ErrMalformed = errors.New("webhook: the signature header is malformed; want t=<unix seconds>,v1=<hex>")
	ErrStale     = errors.New("webhook: the signature's timestamp is too old or in the future")
	ErrMismatch  = errors.New("webhook: the signature does not match the body")
)

// Verify checks a POST as a receiver should: the header's timestamp within
// tolerance of now (against replays), and one of its v1 signatures equal,
// in constant time, to the HMAC of "<t>.<body>" under secret.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrMalformed
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrMalformed
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w (%s)", ErrStale, d.Round(time.Second))
	}
	want := []byte(mac(secret, ts, body))
	for _, s := range sigs {
		if hmac.Equal([]byte(s), want) {
			return nil
		}
	}
	return ErrMismatch
}
