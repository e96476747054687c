// Package sse writes a Server-Sent Events stream: the response's headers,
// then comments and events, each write under its own deadline and flushed
// at once (docs/dispatcher.md, "The event stream", and docs/inbox.md
// describe the streams).
package sse

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Stream is one response's event stream. It is not safe for concurrent
// use: one goroutine, the handler's, writes it.
type Stream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

// Start answers 200 with an event stream's headers — cacheControl as the
// Cache-Control header, and no buffering by a proxy in between — and
// returns the stream. Each later write must end within timeout.
func Start(w http.ResponseWriter, cacheControl string, timeout time.Duration) *Stream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", cacheControl)
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &Stream{w: w, rc: http.NewResponseController(w), timeout: timeout}
}

// Comment writes a comment line (": text"), such as a keepalive. Like
// every write it reports false once the stream cannot be written: the
// client went away, or a write passed its deadline.
func (s *Stream) Comment(text string) bool { return s.write(": " + text + "\n\n") }

// Retry tells the client how long to wait before it reconnects.
func (s *Stream) Retry(d time.Duration) bool {
	return s.write("retry: " + strconv.FormatInt(d.Milliseconds(), 10) + "\n\n")
}

// Event writes an event named event with data, one line of text (JSON),
// and with id when id is not empty.
func (s *Stream) Event(id, event string, data []byte) bool {
	var b strings.Builder
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	b.WriteString("event: " + event + "\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
	return s.write(b.String())
}

// JSON writes an event named event whose data is v as JSON, with no id.
func (s *Stream) JSON(event string, v any) bool {
	data, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return s.Event("", event, data)
}

func (s *Stream) write(text string) bool {
	if err := s.rc.SetWriteDeadline(time.Now().Add(s.timeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	if _, err := s.w.Write([]byte(text)); err != nil {
		return false
	}
	return s.rc.Flush() == nil
}
