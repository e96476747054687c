package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/termsafe"
)

// progress reports the state of a followed dispatch on stderr. On a
// terminal it keeps one line, redrawn every half second with the elapsed
// time and the current state; otherwise it writes one plain line per
// change. Text meant for stdout goes through out, which takes the
// progress line down first so the two never mix on one screen. A quiet
// progress (--json) writes nothing of its own.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	quiet bool
	start time.Time
	state string
	shown bool // the progress line is on the screen

	stop chan struct{}
	done chan struct{}
}

// progressWidth keeps the progress line on one row of a usual terminal,
// so that redrawing it never leaves wrapped remains.
const progressWidth = 79

func newProgress(w io.Writer, quiet bool) *progress {
	p := &progress{w: w, tty: isTerminal(w), quiet: quiet, start: time.Now()}
	if p.tty && !quiet {
		p.stop, p.done = make(chan struct{}), make(chan struct{})
		go p.tick(p.stop, p.done)
	}
	return p
}

func (p *progress) tick(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			p.mu.Lock()
			p.draw()
			p.mu.Unlock()
		}
	}
}

// set records a new state: redrawn on a terminal, a plain line otherwise.
func (p *progress) set(state string) {
	if p.quiet {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// The state quotes what runs report: it never acts on the terminal.
	state = termsafe.Text(state)
	p.state = state
	if p.tty {
		p.draw()
		return
	}
	fmt.Fprintf(p.w, "[%6s] %s\n", p.elapsed(), state)
}

// note writes a line on stderr (not on a quiet progress).
func (p *progress) note(format string, a ...any) {
	if p.quiet {
		return
	}
	p.out(p.w, format+"\n", a...)
}

// out writes to w (stdout, usually) with the progress line out of the way.
func (p *progress) out(w io.Writer, format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	fmt.Fprintf(termsafe.NewWriter(w), format, a...)
	if p.state != "" {
		p.draw()
	}
}

// close stops the redraws and takes the progress line down.
func (p *progress) close() {
	if p.stop != nil {
		close(p.stop)
		<-p.done
		p.stop = nil
	}
	p.mu.Lock()
	p.clear()
	p.mu.Unlock()
}

func (p *progress) elapsed() string {
	d := time.Since(p.start)
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

func (p *progress) draw() {
	if !p.tty || p.quiet || p.state == "" {
		return
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s", clip.Line(p.elapsed()+"  "+p.state, progressWidth))
	p.shown = true
}

func (p *progress) clear() {
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.shown = false
	}
}
