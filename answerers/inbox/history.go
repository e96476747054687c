package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The inbox keeps only pending questions in memory; closed ones are read
// from the agora_questions bucket when a page asks for them
// (docs/inbox.md, "Memory and history"). History is read newest first
// (by the record's last write), a page at a time: the walk goes down the
// bucket's stream from a cursor (a stream sequence), keeps each key's
// latest revision once, and stops after a page of matches or a bounded
// number of messages, returning where to go on.

// maxWalk bounds the messages one history page looks at, so a filter
// that matches little answers in bounded time (the cursor goes on).
const maxWalk = 5000

// lookup returns question qid: from memory while pending, else from the
// bucket.
func (s *Server) lookup(ctx context.Context, qid string) (*Question, bool) {
	if q, ok := s.store.get(qid); ok {
		return q, true
	}
	if s.records == nil || lifecycle.ValidToken(qid) != nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	e, err := s.records.Get(ctx, qid)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Warn("read question record", "question_id", qid, "err", err)
		}
		return nil, false
	}
	return decodeQuestion(e)
}

// earlier returns the questions of the thread's rounds before q's that u
// may see (those of routes u may not are left out: a thread's questions
// may go to several routes), in round order: one read per earlier round
// (the thread view lists them).
func (s *Server) earlier(ctx context.Context, u *user, q *Question, th *client.Thread) []*Question {
	if th == nil {
		return nil
	}
	var out []*Question
	for _, r := range th.Rounds {
		if r.Round >= q.Round || r.Result == nil || r.Result.Kind != lifecycle.KindNeedsInput {
			continue
		}
		if e, ok := s.lookup(ctx, lifecycle.QuestionID(r.DispatchID)); ok && e.QuestionID != q.QuestionID && s.visible(u, e) {
			out = append(out, e)
		}
	}
	return out
}

// historyPage is one page of closed questions.
type historyPage struct {
	Rows []*Question
	// Next is the cursor of the next page; "" at the end.
	Next string
}

// history walks the bucket down from cursor ("" starts at the newest
// write) and returns up to limit closed questions keep accepts.
func (s *Server) history(ctx context.Context, cursor string, limit int, keep func(*Question) bool) (historyPage, error) {
	if s.questionsStream == nil {
		return historyPage{}, errors.New("inbox: the questions bucket is not open yet")
	}
	var after uint64
	if cursor != "" {
		n, err := strconv.ParseUint(cursor, 10, 64)
		if err != nil || n == 0 {
			return historyPage{}, problem.Invalid(client.FieldError{Field: "cursor", Message: "not a cursor this inbox gave"})
		}
		after = n
	}
	// A record written while the first page is walked moves to a newer
	// sequence than the walk's start, and its older one is gone (the
	// bucket keeps one revision): the first page is walked again from the
	// new end when the bucket changed meanwhile (a router clears what it
	// published just after an answer), up to three times.
	for attempt := 1; ; attempt++ {
		info, err := s.questionsStream.Info(ctx)
		if err != nil {
			return historyPage{}, fmt.Errorf("inbox: questions bucket: %w", err)
		}
		first, last := info.State.FirstSeq, info.State.LastSeq
		from := last
		if after > 0 {
			from = min(after, last)
		}
		page, err := s.historyFrom(ctx, first, from, limit, keep)
		if err != nil || after > 0 || attempt == 3 {
			return page, err
		}
		if info, err = s.questionsStream.Info(ctx); err != nil || info.State.LastSeq == last {
			return page, nil
		}
	}
}

// historyFrom is history's walk, from sequence from down to first.
func (s *Server) historyFrom(ctx context.Context, first, from uint64, limit int, keep func(*Question) bool) (historyPage, error) {
	var page historyPage
	walked := 0
	prefix := "$KV." + lifecycle.BucketQuestions + "."
	seq := from
	for ; seq >= first && seq > 0 && len(page.Rows) < limit && walked < maxWalk; seq-- {
		walked++
		m, err := s.questionsStream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return historyPage{}, fmt.Errorf("inbox: read questions bucket at %d: %w", seq, err)
		}
		if op := m.Header.Get("KV-Operation"); op != "" {
			continue // a delete or purge marker
		}
		key, ok := strings.CutPrefix(m.Subject, prefix)
		if !ok {
			continue
		}
		// Only a key's latest revision counts: an older one is history
		// of a record that changed since.
		latest, err := s.questionsStream.GetLastMsgForSubject(ctx, m.Subject)
		if err != nil || latest.Sequence != seq {
			continue
		}
		q, ok := decodeRecord(key, m.Data, seq)
		if !ok || q.Pending() || !keep(q) {
			continue
		}
		page.Rows = append(page.Rows, q)
	}
	if seq >= first && seq > 0 {
		page.Next = strconv.FormatUint(seq, 10)
	}
	return page, nil
}
