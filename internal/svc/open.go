package svc

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Opener binds a service to the streams, consumers and buckets it uses,
// one after the other, and keeps the first failure: once one has failed,
// later calls open nothing and return nil. Its error reads
// "<service>: <what> <name>: <cause>" and wraps the cause, so Missing and
// Bind see through it. An Opener is used by one goroutine, for one bind.
type Opener struct {
	ctx     context.Context
	js      jetstream.JetStream
	service string
	err     error
}

// NewOpener returns an Opener that opens through js within ctx, naming
// service in its error.
func NewOpener(ctx context.Context, js jetstream.JetStream, service string) *Opener {
	return &Opener{ctx: ctx, js: js, service: service}
}

// Err is the first failure, nil when everything opened.
func (o *Opener) Err() error { return o.err }

// Stream opens the stream name.
func (o *Opener) Stream(name string) jetstream.Stream {
	return open(o, "stream "+name, func() (jetstream.Stream, error) { return o.js.Stream(o.ctx, name) })
}

// Consumer opens the consumer name of stream.
func (o *Opener) Consumer(stream, name string) jetstream.Consumer {
	return open(o, "consumer "+stream+"/"+name, func() (jetstream.Consumer, error) { return o.js.Consumer(o.ctx, stream, name) })
}

// KeyValue opens the KV bucket name.
func (o *Opener) KeyValue(name string) jetstream.KeyValue {
	return open(o, "bucket "+name, func() (jetstream.KeyValue, error) { return o.js.KeyValue(o.ctx, name) })
}

// ObjectStore opens the object store name.
func (o *Opener) ObjectStore(name string) jetstream.ObjectStore {
	return open(o, "object store "+name, func() (jetstream.ObjectStore, error) { return o.js.ObjectStore(o.ctx, name) })
}

func open[T any](o *Opener, what string, f func() (T, error)) T {
	var zero T
	if o.err != nil {
		return zero
	}
	v, err := f()
	if err != nil {
		o.err = fmt.Errorf("%s: %s: %w", o.service, what, err)
		return zero
	}
	return v
}
