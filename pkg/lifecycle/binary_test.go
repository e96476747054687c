package lifecycle_test

import (
	"bytes"
	"context"
	"reflect"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// sdkEncode is what the CloudEvents SDK's NATS JetStream binding writes for
// e in binary mode, with the two changes Encode makes (docs/wire.md,
// "CloudEvents"): the data content type as content-type, and Nats-Msg-Id.
func sdkEncode(t *testing.T, e lifecycle.Event) (nats.Header, []byte) {
	t.Helper()
	var buf bytes.Buffer
	h, err := cejs.WriteMsg(binding.WithForceBinary(context.Background()), binding.ToMessage(&e), &buf)
	if err != nil {
		t.Fatal(err)
	}
	if ct := h.Get("ce-datacontenttype"); ct != "" {
		h.Del("ce-datacontenttype")
		h.Set("content-type", ct)
	}
	h.Set(jetstream.MsgIDHeader, e.ID())
	return h, buf.Bytes()
}

// TestEncodeWritesWhatTheSDKWrites holds Encode's own header writing equal
// to the SDK's binding, header for header and byte for byte, for every
// kind of event Agora publishes and for events a caller built by hand.
func TestEncodeWritesWhatTheSDKWrites(t *testing.T) {
	var events []lifecycle.Event
	for _, s := range samples() {
		for _, opts := range [][]lifecycle.Option{
			{lifecycle.WithTime(testTime)},
			{lifecycle.WithTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
			{lifecycle.WithParentSpan("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), lifecycle.WithTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))},
		} {
			e, err := lifecycle.New(testSource, s.data, opts...)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			events = append(events, e)
		}
	}
	// By hand: extensions of other types, no time, no subject, no data; a
	// time outside UTC.
	bare := event.New()
	bare.SetID("x-1")
	bare.SetSource("urn:agora:test")
	bare.SetType("dev.example.other")
	bare.SetExtension("count", 7)
	bare.SetExtension("flag", true)
	bare.SetExtension("note", "a b")
	events = append(events, bare)
	zoned := event.New()
	zoned.SetID("x-2")
	zoned.SetSource("/agora/test/2")
	zoned.SetType("dev.example.other")
	zoned.SetTime(time.Date(2026, 5, 6, 7, 8, 9, 10, time.FixedZone("X", 3600)))
	if err := zoned.SetData("text/plain", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	events = append(events, zoned)
	// Another spec version goes through the SDK itself.
	v03 := event.New(event.CloudEventsVersionV03)
	v03.SetID("x-3")
	v03.SetSource("/agora/test/3")
	v03.SetType("dev.example.other")
	events = append(events, v03)

	for _, e := range events {
		m, err := lifecycle.Encode("agora.test", e)
		if err != nil {
			t.Fatalf("%s: %v", e.ID(), err)
		}
		wantH, wantBody := sdkEncode(t, e)
		if !reflect.DeepEqual(m.Header, wantH) {
			t.Errorf("%s (%s): headers\n got  %v\n want %v", e.ID(), e.Type(), m.Header, wantH)
		}
		if !bytes.Equal(m.Data, wantBody) || (len(m.Data) == 0) != (len(wantBody) == 0) {
			t.Errorf("%s: body %q, want %q", e.ID(), m.Data, wantBody)
		}
		if m.Subject != "agora.test" {
			t.Errorf("%s: subject %q", e.ID(), m.Subject)
		}
		// And the SDK reads it back as the same event.
		back, err := lifecycle.Decode(m.Header, m.Data)
		if err != nil {
			t.Fatalf("%s: decode: %v", e.ID(), err)
		}
		if back.Context.String() != e.Context.String() || !bytes.Equal(back.Data(), e.Data()) {
			t.Errorf("%s: decoded\n%s\nwant\n%s", e.ID(), back.String(), e.String())
		}
	}
}

// BenchmarkEncode times Encode for a terminal event, as a worker publishes
// one per dispatch; BenchmarkEncodeSDK the SDK's binding for the same event.
func BenchmarkEncode(b *testing.B) {
	e := benchEvent(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := lifecycle.Encode("agora.test", e); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeSDK(b *testing.B) {
	e := benchEvent(b)
	b.ReportAllocs()
	for b.Loop() {
		var buf bytes.Buffer
		if _, err := cejs.WriteMsg(binding.WithForceBinary(context.Background()), binding.ToMessage(&e), &buf); err != nil {
			b.Fatal(err)
		}
	}
}

func benchEvent(b *testing.B) lifecycle.Event {
	b.Helper()
	d := &lifecycle.Finished{Common: common(), Output: []byte(`{"ok":true}`), ExitCode: 0}
	e, err := lifecycle.New(testSource, d, lifecycle.WithTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
	if err != nil {
		b.Fatal(err)
	}
	return e
}
