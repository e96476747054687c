// Package auditlog writes Agora's decision log: one hash-chained entry
// (pkg/audit) for every step a person's attention touches — a question
// asked, escalated, joined, answered, expired, withdrawn, every cancel and
// every dispatch a worker refused below the sandbox floor — derived from
// the question events the router publishes on AGORA_QUESTIONS and the
// cancelled and floor-refused failed events on AGORA_LIFECYCLE, appended
// to the AGORA_AUDIT stream. It never changes what it reads.
//
// One chain, whatever crashes: every entry carries the writer's cursors
// (the source sequences it consumed through) and every append expects the
// stream's last sequence to be the entry it follows
// (Nats-Expected-Last-Sequence), so a second writer, or one restarted
// after a crash, cannot fork the chain: the append it loses is refused,
// and it rereads the last entry and resumes from that entry's cursors
// (docs/audit.md, "The writer").
package auditlog

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/jserr"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Deps are the writer's collaborators (svc.Deps). Every field is
// optional.
type Deps = svc.Deps

// Service is the audit writer. Create it with New and run it with Run.
// Any number may run: they write one chain.
type Service struct {
	cfg      Config
	nc       *nats.Conn
	ownConn  bool
	log      *slog.Logger
	key      ed25519.PrivateKey
	metrics  *metrics
	gatherer prometheus.Gatherer
	ready    chan struct{}
	once     sync.Once
	running  atomic.Bool
}

// New checks cfg, reads the signing key and connects to NATS when deps
// has no Conn; it does not touch JetStream until Run.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("auditlog: config: %w", err)
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, log: svc.Logger(deps.Logger, "service", "auditlog"), ready: make(chan struct{})}
	if cfg.SigningKeyFile != "" {
		k, err := audit.ReadPrivateKey(cfg.SigningKeyFile)
		if err != nil {
			return nil, fmt.Errorf("auditlog: %w", err)
		}
		s.key = k
	}
	reg, gatherer := svc.Registry(deps.Registerer)
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s.metrics, s.gatherer = m, gatherer
	if s.nc, s.ownConn, err = svc.Conn(deps.Conn, "auditlog", "", cfg.NATSURL, cfg.NATSCreds, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// Ready is closed once Run reads its sources.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Handler serves /healthz and /metrics.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", svc.MetricsHandler(s.gatherer))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		status, code := "ok", http.StatusOK
		if s.nc.Status() != nats.CONNECTED {
			status, code = "nats "+strings.ToLower(s.nc.Status().String()), http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]string{"status": status})
	})
	return mux
}

// Run appends entries until ctx ends. It fails at once when AGORA_AUDIT
// or a source stream does not exist; a lost append or a NATS outage makes
// it reread the head and resume. Run may be called once.
func (s *Service) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("auditlog: Run called twice")
	}
	if s.ownConn {
		defer s.nc.Close()
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("auditlog: jetstream: %w", err)
	}
	for _, name := range []string{audit.Stream, lifecycle.StreamQuestions, lifecycle.StreamLifecycle} {
		if _, err := js.Stream(ctx, name); err != nil {
			return fmt.Errorf("auditlog: stream %s: %w (provision the streams first)", name, err)
		}
	}
	if s.cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("auditlog: %s: %w", s.cfg.HTTPAddr, err)
		}
		srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	s.log.Info("audit writer started", "signed", s.key != nil, "checkpoint_every", s.cfg.CheckpointEvery, "checkpoint_interval", s.cfg.CheckpointInterval)
	for {
		err := s.session(ctx, js)
		if ctx.Err() != nil {
			s.log.Info("audit writer stopped")
			return nil
		}
		if errors.Is(err, errConflict) {
			s.metrics.conflicts.Inc()
			s.log.Info("another writer appended first: rereading the head")
			continue
		}
		s.metrics.retries.Inc()
		s.log.Warn("audit writer: will retry", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// errConflict reports an append another writer won.
var errConflict = errors.New("auditlog: the log's head moved")

// head is the last entry and the stream sequence it is stored at.
type head struct {
	entry  *audit.Entry // nil: the log is empty
	seq    uint64
	cq, cl uint64 // the cursors to resume from
}

func (s *Service) readHead(ctx context.Context, js jetstream.JetStream) (head, error) {
	st, err := js.Stream(ctx, audit.Stream)
	if err != nil {
		return head{}, err
	}
	m, err := st.GetLastMsgForSubject(ctx, audit.Subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return head{}, nil
	}
	if err != nil {
		return head{}, fmt.Errorf("read the last entry: %w", err)
	}
	e, err := audit.Parse(m.Data)
	if err != nil {
		return head{}, fmt.Errorf("last entry (stream seq %d): %w", m.Sequence, err)
	}
	return head{entry: &e, seq: m.Sequence, cq: uint64(e.CursorQuestions), cl: uint64(e.CursorLifecycle)}, nil
}

// source is a message read from one of the source streams.
type source struct {
	stream string
	seq    uint64
	msg    jetstream.Msg
}

// session reads the head, then the sources from its cursors, appending
// until ctx ends or an append fails.
func (s *Service) session(ctx context.Context, js jetstream.JetStream) error {
	h, err := s.readHead(ctx, js)
	if err != nil {
		return err
	}
	w := &writer{s: s, js: js, h: h}
	if h.entry != nil {
		s.metrics.head.Set(float64(h.entry.Seq))
		// A crash between an entry and the checkpoint it made due.
		if h.entry.Kind != audit.KindCheckpoint && h.entry.Seq%int64(s.cfg.CheckpointEvery) == 0 {
			if err := w.checkpoint(ctx); err != nil {
				return err
			}
		}
	}
	if err := w.lifecycleGap(ctx); err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in := make(chan source, 64)
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var lc jetstream.Consumer
	for _, src := range []struct {
		stream, filter string
		from           uint64
	}{
		{lifecycle.StreamQuestions, lifecycle.SubjectQuestionsAll, w.h.cq + 1},
		{lifecycle.StreamLifecycle, lifecycle.LifecycleFilter(lifecycle.KindCancelled, "", ""), w.h.cl + 1},
	} {
		filters := []string{src.filter}
		if src.stream == lifecycle.StreamLifecycle {
			// Failed events too: those refused below the sandbox floor.
			filters = append(filters, lifecycle.LifecycleFilter(lifecycle.KindFailed, "", ""))
		}
		cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: src.from}
		c, err := js.OrderedConsumer(sctx, src.stream, cfg)
		if err != nil {
			return fmt.Errorf("read %s: %w", src.stream, err)
		}
		if src.stream == lifecycle.StreamLifecycle {
			lc = c
		}
		it, err := c.Messages(jetstream.PullMaxMessages(256))
		if err != nil {
			return fmt.Errorf("read %s: %w", src.stream, err)
		}
		wg.Go(func() { <-sctx.Done(); it.Stop() })
		wg.Go(func() {
			for {
				m, err := it.Next()
				if err != nil {
					if !errors.Is(err, jetstream.ErrMsgIteratorClosed) && sctx.Err() == nil {
						errc <- fmt.Errorf("read %s: %w", src.stream, err)
					}
					return
				}
				meta, err := m.Metadata()
				if err != nil {
					continue
				}
				select {
				case in <- source{src.stream, meta.Sequence.Stream, m}:
				case <-sctx.Done():
					return
				}
			}
		})
	}
	w.lifecycle = lc
	s.once.Do(func() { close(s.ready) })
	tick := time.NewTicker(min(s.cfg.CheckpointInterval, time.Minute))
	defer tick.Stop()
	lastCheckpoint := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case src := <-in:
			if err := w.take(ctx, src); err != nil {
				return err
			}
		case now := <-tick.C:
			if now.Sub(lastCheckpoint) < s.cfg.CheckpointInterval {
				continue
			}
			lastCheckpoint = now
			if err := w.idleCheckpoint(ctx); err != nil {
				return err
			}
		}
	}
}

// writer appends entries after h.
type writer struct {
	s         *Service
	js        jetstream.JetStream
	h         head
	lifecycle jetstream.Consumer
	questions jetstream.KeyValue // agora_questions, opened on first use
}

// take turns one source message into its entries: a gap first when
// source sequences are missing before it, then its own.
func (w *writer) take(ctx context.Context, src source) error {
	switch src.stream {
	case lifecycle.StreamQuestions:
		if src.seq <= w.h.cq {
			return nil // appended before this session
		}
		if src.seq > w.h.cq+1 {
			// The questions consumer reads every subject of its stream:
			// a jump is events removed before they were read.
			if err := w.gap(ctx, lifecycle.StreamQuestions, w.h.cq+1, src.seq-1); err != nil {
				return err
			}
		}
	case lifecycle.StreamLifecycle:
		if src.seq <= w.h.cl {
			return nil
		}
	}
	e, id, err := w.derive(ctx, src)
	if err != nil {
		w.s.log.Warn("source event not recorded: unreadable", "stream", src.stream, "seq", src.seq, "err", err)
		e = &audit.Entry{Kind: audit.KindGap, Source: src.stream, GapFrom: int64(src.seq), GapTo: int64(src.seq),
			Detail: "the event could not be read: " + err.Error(), At: now()}
		id = fmt.Sprintf("gap.%s.%d", src.stream, src.seq)
	}
	if src.stream == lifecycle.StreamQuestions {
		w.h.cq = src.seq
	} else {
		w.h.cl = src.seq
	}
	if e == nil {
		return nil // an event that is no step of the log (a failure other than a floor refusal)
	}
	return w.append(ctx, e, id)
}

// lifecycleGap records lifecycle events removed before they were read:
// the stream's first sequence is past the cursor. Cancels among them are
// missing from the log. (Questions gaps show as a jump in sequence.)
func (w *writer) lifecycleGap(ctx context.Context) error {
	st, err := w.js.Stream(ctx, lifecycle.StreamLifecycle)
	if err != nil {
		return err
	}
	first := st.CachedInfo().State.FirstSeq
	if first > w.h.cl+1 && st.CachedInfo().State.Msgs > 0 {
		from := w.h.cl + 1
		w.h.cl = first - 1
		return w.gap(ctx, lifecycle.StreamLifecycle, from, first-1)
	}
	return nil
}

func (w *writer) gap(ctx context.Context, stream string, from, to uint64) error {
	w.s.log.Warn("source events removed before the log read them", "stream", stream, "from", from, "to", to)
	e := &audit.Entry{Kind: audit.KindGap, At: now(), Source: stream, GapFrom: int64(from), GapTo: int64(to),
		Detail: "events removed from the stream (its retention) before the log read them"}
	if stream == lifecycle.StreamQuestions {
		w.h.cq = to
	}
	return w.append(ctx, e, fmt.Sprintf("gap.%s.%d-%d", stream, from, to))
}

// idleCheckpoint writes a checkpoint when anything happened since the
// last one. First it moves the lifecycle cursor to the stream's last
// sequence when every cancel up to there was taken, so a quiet log does
// not read as a gap once the stream's retention passes its cursor.
func (w *writer) idleCheckpoint(ctx context.Context) error {
	if st, err := w.js.Stream(ctx, lifecycle.StreamLifecycle); err == nil && w.lifecycle != nil {
		last := st.CachedInfo().State.LastSeq
		if ci, err := w.lifecycle.Info(ctx); err == nil && ci.NumPending == 0 && ci.Delivered.Stream <= w.h.cl {
			w.h.cl = max(w.h.cl, last)
		}
	}
	if e := w.h.entry; e != nil && e.Kind == audit.KindCheckpoint && uint64(e.CursorQuestions) == w.h.cq && uint64(e.CursorLifecycle) == w.h.cl {
		return nil
	}
	if w.h.entry == nil && w.h.cq == 0 && w.h.cl == 0 {
		return nil
	}
	return w.checkpoint(ctx)
}

func (w *writer) checkpoint(ctx context.Context) error {
	var count int64
	var headHash string
	if w.h.entry != nil {
		count, headHash = w.h.entry.Seq, w.h.entry.Hash
	} else {
		headHash = audit.Genesis
	}
	e := &audit.Entry{Kind: audit.KindCheckpoint, At: now(), HeadHash: headHash, Count: count}
	return w.append(ctx, e, "checkpoint."+strconv.FormatInt(count+1, 10))
}

// append links e after the head, seals it and publishes it expecting the
// head to be the stream's last message.
func (w *writer) append(ctx context.Context, e *audit.Entry, id string) error {
	e.Link(w.h.entry)
	e.CursorQuestions, e.CursorLifecycle = int64(w.h.cq), int64(w.h.cl)
	if e.Kind == audit.KindCheckpoint && w.s.key != nil {
		// The signature covers count and head hash.
		audit.Sign(e, w.s.key)
	}
	line, err := e.Seal()
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ack, err := w.js.PublishMsg(actx, &nats.Msg{Subject: audit.Subject, Data: line},
		jetstream.WithExpectLastSequence(w.h.seq), jetstream.WithMsgID(id))
	switch {
	case jserr.WrongLastSequence(err):
		return errConflict
	case err != nil:
		return fmt.Errorf("append entry %d: %w", e.Seq, err)
	case ack.Duplicate:
		// Another writer appended this event already.
		return errConflict
	}
	w.h.entry, w.h.seq = e, ack.Sequence
	w.s.metrics.entries.WithLabelValues(e.Kind).Inc()
	w.s.metrics.head.Set(float64(e.Seq))
	if e.Kind != audit.KindCheckpoint && e.Seq%int64(w.s.cfg.CheckpointEvery) == 0 {
		return w.checkpoint(ctx)
	}
	return nil
}

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }
