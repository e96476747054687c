package svc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ProvisionHint is appended to a start-up error when a stream, consumer or
// bucket really does not exist.
const ProvisionHint = " (run `agora dev`, or provision the streams first: AGORA_PROVISION=true or the provision job)"

// Missing reports whether err says that a stream, consumer, bucket or
// object store does not exist: a start-up error no retry will mend.
func Missing(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// Bind runs bind until it succeeds, retrying with backoff (100 ms doubling
// to 5 s) while it fails for any reason other than a missing stream,
// consumer or bucket — a timeout or "no response from stream" during a
// cluster's leader election, a NATS reconnect. It logs every failed
// attempt. It gives up when ctx ends (the service's shutdown) and returns
// the last error; a missing resource is returned at once with
// ProvisionHint. Each attempt gets its own deadline of perAttempt (default
// 10 s), so one stuck request cannot use up the whole start-up.
func Bind(ctx context.Context, log *slog.Logger, perAttempt time.Duration, bind func(ctx context.Context) error) error {
	if perAttempt <= 0 {
		perAttempt = 10 * time.Second
	}
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, perAttempt)
		err := bind(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info("bound to JetStream", "attempts", attempt)
			}
			return nil
		}
		if Missing(err) {
			return fmt.Errorf("%w%s", err, ProvisionHint)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (gave up at shutdown after %d attempts)", err, attempt)
		}
		log.Warn("cannot bind to JetStream yet; retrying", "err", err, "attempt", attempt, "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up at shutdown after %d attempts)", err, attempt)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
