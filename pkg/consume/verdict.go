package consume

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A Verdict says what becomes of a message once it has been handled: it is
// acknowledged, handed back to be delivered again after a delay, or
// terminated so that it is never delivered again. The zero Verdict leaves
// the message as it is, as [Leave] does.
//
// A handler decides the verdict; [Settle] (or [Run], after the handler
// returns) applies it. The words are nats.go's: Ack, DoubleAck, Nak and
// Term are the jetstream.Msg methods they call.
type Verdict struct {
	kind   kind
	delay  time.Duration
	reason string
}

type kind int

const (
	kindLeave kind = iota
	kindAck
	kindDoubleAck
	kindNak
	kindTerm
)

// Ack is the verdict of a message that is done with. The acknowledgement
// is sent without waiting for the server's confirmation: a lost one makes
// the server deliver the message again, so use it when a second delivery
// is harmless (the handler notices that the work is done).
func Ack() Verdict { return Verdict{kind: kindAck} }

// DoubleAck is Ack confirmed by the server: [Settle] waits for the
// confirmation (jetstream.Msg.DoubleAck), so a lost acknowledgement is an
// error rather than a second delivery.
func DoubleAck() Verdict { return Verdict{kind: kindDoubleAck} }

// Nak is the verdict of a message that failed for now: the server delivers
// it again once delay has passed (at once for a delay of zero or less).
func Nak(delay time.Duration) Verdict { return Verdict{kind: kindNak, delay: max(delay, 0)} }

// Term is the verdict of a message that can never succeed: the server
// never delivers it again. reason, when not empty, travels with the
// termination to the server's advisory.
func Term(reason string) Verdict { return Verdict{kind: kindTerm, reason: reason} }

// Leave is the verdict that neither acknowledges nor hands back: the
// server delivers the message again once the consumer's AckWait passes
// without news. It is for a handler that settled the message itself, or
// that no longer owns the delivery.
func Leave() Verdict { return Verdict{} }

// String names the verdict: ack, double-ack, nak 2s, term: reason, leave.
func (v Verdict) String() string {
	switch v.kind {
	case kindAck:
		return "ack"
	case kindDoubleAck:
		return "double-ack"
	case kindNak:
		return fmt.Sprintf("nak %s", v.delay)
	case kindTerm:
		if v.reason == "" {
			return "term"
		}
		return "term: " + v.reason
	}
	return "leave"
}

// Settle applies v to m. Only DoubleAck blocks: it waits for the server's
// confirmation until ctx ends. A settle that fails leaves the message to be
// delivered again once the consumer's AckWait passes.
func Settle(ctx context.Context, m jetstream.Msg, v Verdict) error {
	switch v.kind {
	case kindAck:
		return m.Ack()
	case kindDoubleAck:
		return m.DoubleAck(ctx)
	case kindNak:
		if v.delay == 0 {
			return m.Nak()
		}
		return m.NakWithDelay(v.delay)
	case kindTerm:
		if v.reason == "" {
			return m.Term()
		}
		return m.TermWithReason(v.reason)
	}
	return nil
}
