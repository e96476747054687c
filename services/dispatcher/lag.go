package dispatcher

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// consumerLag reports, at each scrape, how far behind Agora's provisioned
// JetStream consumers are: messages not yet delivered and messages
// delivered but not acknowledged. The dispatcher serves it for the whole
// system (it binds every stream); a scrape makes one consumer-info request
// per consumer, bounded by two seconds.
type consumerLag struct {
	s                   *Service
	pending, ackPending *prometheus.Desc
}

// lagged are the consumers reported, by stream.
var lagged = []struct{ stream, consumer string }{
	{lifecycle.StreamRequests, lifecycle.ConsumerDispatcher},
	{lifecycle.StreamDispatch, lifecycle.ConsumerWorkers},
	{lifecycle.StreamLifecycle, provision.ConsumerRouter},
	{lifecycle.StreamLifecycle, provision.ConsumerProjection},
	{lifecycle.StreamAnswers, provision.ConsumerRouterAns},
}

func newConsumerLag(s *Service) *consumerLag {
	labels := []string{"stream", "consumer"}
	return &consumerLag{s: s,
		pending: prometheus.NewDesc("agora_jetstream_consumer_pending_messages",
			"Messages of the stream not yet delivered to the consumer (its lag).", labels, nil),
		ackPending: prometheus.NewDesc("agora_jetstream_consumer_ack_pending_messages",
			"Messages delivered to the consumer and not yet acknowledged (work in progress).", labels, nil),
	}
}

func (l *consumerLag) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.pending
	ch <- l.ackPending
}

func (l *consumerLag) Collect(ch chan<- prometheus.Metric) {
	l.s.bindMu.Lock()
	b := l.s.b
	l.s.bindMu.Unlock()
	if b == nil {
		return // not bound yet
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, c := range lagged {
		cons, err := b.js.Consumer(ctx, c.stream, c.consumer)
		if err != nil {
			continue
		}
		info, err := cons.Info(ctx)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(l.pending, prometheus.GaugeValue, float64(info.NumPending), c.stream, c.consumer)
		ch <- prometheus.MustNewConstMetric(l.ackPending, prometheus.GaugeValue, float64(info.NumAckPending), c.stream, c.consumer)
	}
}
