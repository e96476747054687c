// Package jserr classifies the JetStream publish errors every service
// decides on: a compare-and-set that lost (the subject moved on), and a
// message that can never be stored (too large), which must not be retried.
package jserr

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// WrongLastSequence reports whether a publish was refused by the
// per-subject compare-and-set (Nats-Expected-Last-Subject-Sequence; 10164
// is the replicated stream's variant of 10071).
func WrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// TooLarge reports whether err is a publish that can never succeed: the
// message is larger than the server's max payload (nats.ErrMaxPayload, the
// client's own check against what the server announced) or than the
// stream's maximum message size (JetStream error 10054).
func TooLarge(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}
