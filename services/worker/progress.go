package worker

import (
	"bytes"
	"errors"
	"io"
	"os"
	"time"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Progress: while a run goes on, the worker tails its
// .agora/progress.jsonl (AGORA_PROGRESS_FILE) and publishes the latest
// line as dev.agora.progress.reported on agora.progress.<thread>.<dispatch>.
// Lines are coalesced: at most one report per ProgressInterval, the last
// one always sent when the run ends, before the terminal event. A line over
// lifecycle.MaxProgressLine or not a progress object is skipped and
// counted. The file is read through os.Root without following a symlink,
// so a sub-agent cannot make the worker read and publish a file its
// sandbox denies it. See docs/progress.md.

// ProgressInterval is the shortest time between two progress reports of a
// run (at most 4 a second).
const ProgressInterval = 250 * time.Millisecond

// Bounds on what the tail reads: per poll, and in all for one run.
const (
	progressReadPerPoll = 1 << 20
	progressReadMax     = 64 << 20
)

type progressTail struct {
	s        *Service
	j        *job
	ws       string
	view     func(string) string // where the workspace is read (runFS.viewOr)
	off      int64
	partial  []byte
	long     bool // inside a line already over the limit
	lines    int
	skipped  int
	seq      int
	latest   *lifecycle.Progress
	dirty    bool
	lastSent time.Time
	done     bool // the read budget is spent
}

func (s *Service) newProgressTail(j *job, ws string, view func(string) string) *progressTail {
	return &progressTail{s: s, j: j, ws: ws, view: view}
}

// poll reads what was appended since the last poll (at most budget bytes).
func (p *progressTail) poll(budget int64) {
	if p.done || p.ws == "" {
		return
	}
	dir := p.ws
	if p.view != nil {
		dir = p.view(p.ws) // the workspace's own filesystem, once the launcher made it
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return
	}
	defer root.Close()
	f, err := root.OpenFile(lifecycle.ProgressFile, os.O_RDONLY|oNoFollow, 0)
	if err != nil {
		return // not written yet, or not a regular file we may open
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return
	}
	if fi.Size() < p.off { // truncated or replaced: start over
		p.off, p.partial, p.long = 0, nil, false
	}
	if fi.Size() == p.off {
		return
	}
	if p.off+budget > progressReadMax {
		budget = progressReadMax - p.off
		if budget <= 0 {
			p.done = true
			p.j.log.Warn("progress file past its read budget: no more progress from this run", "bytes", p.off)
			return
		}
	}
	if _, err := f.Seek(p.off, io.SeekStart); err != nil {
		return
	}
	buf, err := io.ReadAll(io.LimitReader(f, budget))
	if err != nil && !errors.Is(err, io.EOF) {
		return
	}
	p.off += int64(len(buf))
	for len(buf) > 0 {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			p.add(buf)
			break
		}
		p.add(buf[:i])
		p.line()
		buf = buf[i+1:]
	}
}

// add appends bytes to the line being read, or drops them once it is over
// the limit.
func (p *progressTail) add(b []byte) {
	if p.long {
		return
	}
	if len(p.partial)+len(b) > lifecycle.MaxProgressLine {
		p.long, p.partial = true, nil
		return
	}
	p.partial = append(p.partial, b...)
}

// line ends the line being read.
func (p *progressTail) line() {
	defer func() { p.partial, p.long = p.partial[:0], false }()
	if p.long {
		p.skipped++
		return
	}
	if len(bytes.TrimSpace(p.partial)) == 0 {
		return
	}
	msg, pct, todo, err := lifecycle.ParseProgressLine(p.partial)
	if err != nil {
		p.skipped++
		return
	}
	p.lines++
	next := &lifecycle.Progress{Common: p.j.common, Attempt: p.j.attempt, Message: msg, Percent: pct, Todo: todo}
	// A line that says only part keeps the rest of the latest report.
	if l := p.latest; l != nil {
		if msg == "" {
			next.Message = l.Message
		}
		if pct == nil {
			next.Percent = l.Percent
		}
		if todo == nil {
			next.Todo = l.Todo
		}
	}
	p.latest, p.dirty = next, true
}

// flush publishes the latest report when there is a new one and the
// interval has passed, or at once with force (the run ended). Reports are
// sent without waiting: they are telemetry, and a lost one is replaced by
// the next.
func (p *progressTail) flush(force bool) {
	if !p.dirty || (!force && time.Since(p.lastSent) < ProgressInterval) {
		return
	}
	p.seq++
	d := *p.latest
	d.Seq, d.Lines, d.Skipped = p.seq, p.lines, p.skipped
	_, m, err := lifecycle.Message(p.s.source, &d, p.j.traceOption())
	if err != nil {
		p.j.log.Warn("progress report not built", "err", err)
		return
	}
	if _, err := p.s.js.PublishMsgAsync(m); err != nil {
		p.j.log.Warn("progress report not sent", "err", err)
	}
	p.s.metrics.progress.Inc()
	p.dirty, p.lastSent = false, time.Now()
}

// finish reads what is left of the file and sends the last report.
func (p *progressTail) finish() {
	for range progressReadMax / progressReadPerPoll {
		before := p.off
		p.poll(progressReadPerPoll)
		if p.off == before || p.done {
			break
		}
	}
	if len(p.partial) > 0 || p.long { // a last line without its newline
		p.line()
	}
	p.flush(true)
	if p.skipped > 0 {
		p.j.log.Info("progress lines skipped", "skipped", p.skipped, "lines", p.lines)
	}
}
