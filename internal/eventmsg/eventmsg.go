// Package eventmsg reads the lifecycle event a consumer's handler was
// given, with the verdict for a message it cannot read (docs/storage.md,
// "Consuming a stream").
package eventmsg

import (
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Read decodes m as a lifecycle event and parses its data. When it
// cannot, ok is false, the reason goes to log, and v is the message's
// verdict: term for an undecodable message or bad data, ack for an event
// type outside the vocabulary (skipped). what names the events the
// handler reads in the bad-data line ("needs_input with bad data
// terminated").
func Read(m jetstream.Msg, log *slog.Logger, what string) (e lifecycle.Event, d lifecycle.Data, v consume.Verdict, ok bool) {
	e, err := lifecycle.DecodeMsg(m)
	if err != nil {
		log.Error("undecodable lifecycle message terminated", "err", err)
		return e, nil, consume.Term("undecodable"), false
	}
	d, err = lifecycle.Parse(e)
	if errors.Is(err, lifecycle.ErrUnknownType) {
		log.Warn("unknown event type skipped", "type", e.Type(), "id", e.ID())
		return e, nil, consume.Ack(), false
	}
	if err != nil {
		log.Error(what+" with bad data terminated", "id", e.ID(), "err", err)
		return e, nil, consume.Term("bad data"), false
	}
	return e, d, v, true
}
