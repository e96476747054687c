package svc

import (
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Release ends a service's use of its NATS connection when it stops: a
// connection it made itself (own) is drained, and closed when draining
// fails; the caller's stays open, flushed (for up to 5 s) so what the
// service published reaches the server.
func Release(nc *nats.Conn, own bool) {
	if own {
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		return
	}
	_ = nc.FlushTimeout(5 * time.Second)
}

// ConsumeErrs logs the errors of a pull consumer named by attrs (such as
// "door", "intake"): a missed heartbeat or a closed connection at debug
// level, as the consumer goes on or the service stops, anything else as a
// warning.
func ConsumeErrs(log *slog.Logger, attrs ...any) jetstream.ConsumeErrHandler {
	return func(_ jetstream.ConsumeContext, err error) {
		args := append(append([]any{}, attrs...), "err", err)
		if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrConnectionClosed) {
			log.Debug("consumer", args...)
			return
		}
		log.Warn("consumer", args...)
	}
}
