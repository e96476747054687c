package answerer

import (
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// DecodeQuestion reads the question event a message of AGORA_QUESTIONS
// carries (docs/wire.md, "Questions and answers"), with the traceparent of
// the span that published it ("" when none). It fails for a message that is
// not a CloudEvent of Agora's vocabulary, whose data does not parse, or that
// is not a question event: such a message can never be handled, and the
// answerers terminate it. The question's Event says which of the question's
// events it is (asked, answered, ...).
func DecodeQuestion(m jetstream.Msg) (q *lifecycle.Question, traceparent string, err error) {
	e, err := lifecycle.DecodeMsg(m)
	if err != nil {
		return nil, "", err
	}
	d, err := lifecycle.Parse(e)
	if err != nil {
		return nil, "", fmt.Errorf("event %s: %w", e.ID(), err)
	}
	q, ok := d.(*lifecycle.Question)
	if !ok {
		return nil, "", fmt.Errorf("event %s: not a question event: %T", e.ID(), d)
	}
	return q, lifecycle.Traceparent(e), nil
}
