package dispatcher_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// sseEvent is one Server-Sent Event, or a comment when Comment is set.
type sseEvent struct {
	ID      uint64
	Type    string // the event field
	Event   lifecycle.Event
	Comment string
}

// sseStream is a Server-Sent Events client on /v1/events.
type sseStream struct {
	t      *testing.T
	cancel context.CancelFunc
	events chan sseEvent
}

// openSSE connects and waits for the stream to be live.
func (h *harness) openSSE(query string, lastID uint64) *sseStream {
	h.t.Helper()
	ctx, cancel := context.WithCancel(h.t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.http.URL+"/v1/events?"+query, nil)
	req.Header.Set("Accept", "text/event-stream")
	if lastID > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatUint(lastID, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		cancel()
		h.t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	s := &sseStream{t: h.t, cancel: cancel, events: make(chan sseEvent, 64)}
	go func() {
		defer resp.Body.Close()
		defer close(s.events)
		r := bufio.NewReader(resp.Body)
		var cur sseEvent
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "":
				if cur.ID != 0 || cur.Comment != "" || cur.Type != "" {
					s.events <- cur
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, ":"):
				cur.Comment = strings.TrimSpace(line[1:])
			case strings.HasPrefix(line, "id: "):
				cur.ID, _ = strconv.ParseUint(line[4:], 10, 64)
			case strings.HasPrefix(line, "event: "):
				cur.Type = line[7:]
			case strings.HasPrefix(line, "data: "):
				if err := json.Unmarshal([]byte(line[6:]), &cur.Event); err != nil {
					h.t.Errorf("data is not a structured CloudEvent: %v: %s", err, line)
				}
			}
		}
	}()
	if c := s.next(); c.Comment != "connected" {
		h.t.Fatalf("first line: %+v", c)
	}
	return s
}

// next returns the next event or comment.
func (s *sseStream) next() sseEvent {
	s.t.Helper()
	select {
	case e, ok := <-s.events:
		if !ok {
			s.t.Fatal("event stream closed")
		}
		return e
	case <-time.After(waitFor):
		s.t.Fatal("no event")
		return sseEvent{}
	}
}

// nextEvent skips comments.
func (s *sseStream) nextEvent() sseEvent {
	s.t.Helper()
	for {
		if e := s.next(); e.Comment == "" {
			return e
		}
	}
}

// quiet asserts no event arrives for a while.
func (s *sseStream) quiet(d time.Duration) {
	s.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case e := <-s.events:
			if e.Comment == "" {
				s.t.Errorf("unexpected event %d %s", e.ID, e.Event.ID())
			}
		case <-deadline:
			return
		}
	}
}

func TestEventsStreamResumes(t *testing.T) {
	h := newHarness(t, dispatcher.Config{SSEKeepalive: 100 * time.Millisecond})
	live := h.openSSE("thread=sse-1", 0)
	other := h.dispatchMicro(lifecycle.Request{Subagent: "planner"}) // another thread: filtered out
	d := h.dispatchMicro(lifecycle.Request{DispatchID: "sse-1", Subagent: "planner"})
	first := live.nextEvent()
	if first.Event.Type() != lifecycle.KindAccepted.Type() || first.Event.ID() != "sse-1.accepted" || first.ID == 0 {
		t.Fatalf("first event: %d %s %s", first.ID, first.Event.Type(), first.Event.ID())
	}
	if c := live.next(); c.Comment != "keepalive" {
		t.Errorf("keepalive: %+v", c)
	}
	live.cancel() // the client goes away

	// Events while it is away: two for the thread, one elsewhere.
	h.publishAsWorker(&lifecycle.Started{Common: d.Record.Common(), WorkerID: "w", Attempt: 1})
	h.publishAsWorker(&lifecycle.Started{Common: other.Record.Common(), WorkerID: "w", Attempt: 1})
	if _, err := h.cl.Cancel(t.Context(), d.DispatchID); err != nil {
		t.Fatal(err)
	}

	resumed := h.openSSE("thread=sse-1", first.ID)
	var got []string
	var last uint64 = first.ID
	for range 2 {
		e := resumed.nextEvent()
		if e.ID <= last {
			t.Errorf("event id %d after %d: a repeat or out of order", e.ID, last)
		}
		last = e.ID
		got = append(got, e.Event.ID())
	}
	if strings.Join(got, ",") != "sse-1.started.1,sse-1.terminal" {
		t.Errorf("resumed events: %v", got)
	}
	resumed.quiet(300 * time.Millisecond)
	resumed.cancel()

	t.Run("from start with a kind filter", func(t *testing.T) {
		s := h.openSSE("kind=accepted&from=start", 0)
		a, b := s.nextEvent(), s.nextEvent()
		if a.Event.ID() != other.DispatchID+".accepted" || b.Event.ID() != "sse-1.accepted" {
			t.Errorf("replay: %s, %s", a.Event.ID(), b.Event.ID())
		}
		s.cancel()
	})
	t.Run("bad queries name the field", func(t *testing.T) {
		for q, field := range map[string]string{"kind=exploded": "kind", "thread=a.b": "thread", "from=yesterday": "from", "last_event_id=x": "last_event_id"} {
			resp, data := h.do(http.MethodGet, "/v1/events?"+q, "", "")
			if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(data), `"field":"`+field+`"`) {
				t.Errorf("%s: %d %s", q, resp.StatusCode, data)
			}
		}
	})
}

// Frames name their CloudEvent type; naming a thread replays its history;
// progress reports come with the lifecycle events (without an id, so they
// never disturb Last-Event-ID), and type= keeps one kind of the two.
func TestEventsStreamTypesHistoryAndProgress(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{DispatchID: "sse-p", Subagent: "planner"})
	h.publishAsWorker(&lifecycle.Started{Common: d.Record.Common(), WorkerID: "w", Attempt: 1})

	// Opened after the events: the thread's history is replayed.
	s := h.openSSE("thread=sse-p", 0)
	a, b := s.nextEvent(), s.nextEvent()
	if a.Event.ID() != "sse-p.accepted" || a.Type != lifecycle.KindAccepted.Type() || b.Type != lifecycle.KindStarted.Type() || b.ID == 0 {
		t.Fatalf("replay: %+v, %+v", a, b)
	}
	h.publishAsWorker(&lifecycle.Progress{Common: d.Record.Common(), Attempt: 1, Seq: 1, Message: "half way", Lines: 1})
	p := s.nextEvent()
	if p.Type != lifecycle.TypeProgress || p.ID != 0 || p.Event.Type() != lifecycle.TypeProgress {
		t.Fatalf("progress frame: %+v", p)
	}
	s.cancel()

	// from=now leaves the history out; Last-Event-ID wins over from=start.
	now := h.openSSE("thread=sse-p&from=now&type=lifecycle", 0)
	now.quiet(300 * time.Millisecond)
	now.cancel()
	resumed := h.openSSE("thread=sse-p&from=start&type=lifecycle", a.ID)
	if e := resumed.nextEvent(); e.ID != b.ID || e.Type != lifecycle.KindStarted.Type() {
		t.Errorf("Last-Event-ID %d with from=start: %+v, want %d", a.ID, e, b.ID)
	}
	resumed.quiet(300 * time.Millisecond)
	resumed.cancel()

	lc := h.openSSE("thread=sse-p&type=lifecycle", 0)
	lc.nextEvent()
	lc.nextEvent()
	h.publishAsWorker(&lifecycle.Progress{Common: d.Record.Common(), Attempt: 1, Seq: 2, Message: "more", Lines: 2})
	lc.quiet(300 * time.Millisecond)
	lc.cancel()

	only := h.openSSE("dispatch=sse-p&type=progress", 0)
	if e := only.nextEvent(); e.Type != lifecycle.TypeProgress {
		t.Errorf("type=progress: %+v", e)
	}
	only.cancel()
	for q, field := range map[string]string{"type=all": "type", "type=progress&kind=started": "type"} {
		resp, data := h.do(http.MethodGet, "/v1/events?"+q, "", "")
		if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(data), `"field":"`+field+`"`) {
			t.Errorf("%s: %d %s", q, resp.StatusCode, data)
		}
	}
}
