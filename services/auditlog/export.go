package auditlog

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/audit"
)

// Filter selects the entries an export holds. The zero value selects
// every entry: a complete export.
type Filter struct {
	Since  time.Time // entries appended at or after Since
	Route  string    // entries of this route
	Thread string    // entries of this thread
}

func (f Filter) complete() bool { return f.Since.IsZero() && f.Route == "" && f.Thread == "" }

func (f Filter) String() string {
	var p []string
	if !f.Since.IsZero() {
		p = append(p, "since="+f.Since.UTC().Format(time.RFC3339))
	}
	if f.Route != "" {
		p = append(p, "route="+f.Route)
	}
	if f.Thread != "" {
		p = append(p, "thread="+f.Thread)
	}
	return strings.Join(p, " ")
}

// keeps reports whether a filtered export holds e: its route and thread
// match; checkpoints and gaps are always kept, since they speak of the
// whole log.
func (f Filter) keeps(e audit.Entry) bool {
	if e.Kind == audit.KindCheckpoint || e.Kind == audit.KindGap {
		return true
	}
	return (f.Route == "" || e.Route == f.Route) && (f.Thread == "" || e.ThreadID == f.Thread)
}

// Export writes the log as JSON lines to w: a header (audit.Header), then
// every entry f selects as stored, up to the entry that was last when
// Export started. Each entry carries its seq, prev_hash and hash, so a
// filtered export is still checked link by link where its entries are
// consecutive (docs/audit.md, "What an export is"). It reads the
// stream with an ordered consumer and blocks until done or ctx ends.
func Export(ctx context.Context, js jetstream.JetStream, f Filter, w io.Writer) (int, error) {
	st, err := js.Stream(ctx, audit.Stream)
	if err != nil {
		return 0, fmt.Errorf("auditlog: stream %s: %w", audit.Stream, err)
	}
	state := st.CachedInfo().State
	bw := bufio.NewWriter(w)
	hdr, _ := json.Marshal(audit.Header{Export: 1, Complete: f.complete() && state.FirstSeq <= 1, Filter: f.String()})
	bw.Write(hdr)
	bw.WriteByte('\n')
	n := 0
	if state.Msgs == 0 {
		return 0, bw.Flush()
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{audit.Subject}}
	if !f.Since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &f.Since
	}
	c, err := js.OrderedConsumer(ctx, audit.Stream, cfg)
	if err != nil {
		return 0, fmt.Errorf("auditlog: read %s: %w", audit.Stream, err)
	}
	for {
		batch, err := c.Fetch(256, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return n, fmt.Errorf("auditlog: read %s: %w", audit.Stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				return n, err
			}
			if meta.Sequence.Stream > state.LastSeq {
				return n, bw.Flush()
			}
			e, err := audit.Parse(m.Data())
			if err != nil {
				return n, fmt.Errorf("auditlog: stream seq %d: %w", meta.Sequence.Stream, err)
			}
			if f.keeps(e) {
				bw.Write(m.Data())
				bw.WriteByte('\n')
				n++
			}
			if meta.Sequence.Stream == state.LastSeq {
				return n, bw.Flush()
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return n, fmt.Errorf("auditlog: read %s: %w", audit.Stream, err)
		}
		if got == 0 && ctx.Err() != nil {
			return n, ctx.Err()
		}
	}
}
