package lifecycle

import (
	"fmt"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
)

// binaryHeader writes a CloudEvents 1.0 event's attributes and extensions
// as the headers of binary content mode (docs/wire.md, "CloudEvents"):
// ce-<name> for each attribute that is set, content-type for datacontenttype,
// ce-time in RFC 3339 with nanoseconds, each extension's value as fmt.Sprint
// gives it. These are the headers the CloudEvents SDK's NATS JetStream
// binding writes, written directly: the SDK's generic binding walks every
// attribute through interfaces and costs several times the encoding itself on
// the dispatch path (docs/performance.md). A test holds the two equal for
// every event Agora publishes. An event of another spec version answers false
// and is left to the SDK.
func binaryHeader(e Event) (nats.Header, bool) {
	ec, ok := e.Context.(*event.EventContextV1)
	if !ok || ec == nil {
		return nil, false
	}
	h := make(nats.Header, 10+len(ec.Extensions))
	set := func(k, v string) {
		if v != "" { // the SDK treats a blank attribute as missing
			h[k] = []string{v}
		}
	}
	set("ce-specversion", event.CloudEventsVersionV1)
	set("ce-id", ec.ID)
	set("ce-source", ec.GetSource())
	set("ce-type", ec.Type)
	set("content-type", ec.GetDataContentType())
	set("ce-dataschema", ec.GetDataSchema())
	set("ce-subject", ec.GetSubject())
	if t := ec.GetTime(); !t.IsZero() {
		h["ce-time"] = []string{t.Format(time.RFC3339Nano)}
	}
	for k, v := range ec.Extensions {
		h["ce-"+k] = []string{fmt.Sprint(v)}
	}
	return h, true
}
