package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/services/worker"
)

// CoalesceConfig sizes `agora bench --scale coalesce`: Threads threads
// ask the same question, which must make one waiting question
// (docs/router.md, "Ask once"); one answer then resumes them all.
type CoalesceConfig struct {
	Threads  int // default 1000
	InFlight int // threads asking at once; default 64
	Slots    int // worker slots; default 16
	// Deadline bounds the whole scenario; default 5 minutes and 200 ms a
	// thread. A dispatch that ends failed or cancelled stops it sooner.
	Deadline time.Duration
}

// CoalesceReport is the scenario's result.
type CoalesceReport struct {
	Threads    int     `json:"threads"`
	AskSeconds float64 `json:"ask_seconds"` // first dispatch → every thread on the one question
	// What the router's index of waiting questions (client.Waiting, as
	// `agora questions`) and the inbox counted with every thread asked:
	// one question, listing every thread.
	Waiting        int `json:"waiting_questions"`
	WaitingThreads int `json:"waiting_threads"`
	InboxPending   int `json:"inbox_pending"`
	// Memory of the whole process (server, dispatcher, worker, router and
	// inbox, as `agora dev`): before asking, with every thread waiting, and
	// after every thread finished. The router's and the inbox's shares are
	// the Go heap in use allocated under their own code (a heap profile's
	// stacks at a sampling rate of 4 KiB), as the process's RSS cannot be
	// split by service.
	StartHeapMiB       float64 `json:"start_heap_inuse_mib"`
	StartRSSMiB        float64 `json:"start_rss_mib"`
	HeapMiB            float64 `json:"heap_inuse_mib"`
	RSSMiB             float64 `json:"rss_mib"`
	RouterHeapMiB      float64 `json:"router_heap_inuse_mib"`
	InboxHeapMiB       float64 `json:"inbox_heap_inuse_mib"`
	StartRouterHeapMiB float64 `json:"start_router_heap_inuse_mib"`
	StartInboxHeapMiB  float64 `json:"start_inbox_heap_inuse_mib"`
	EndHeapMiB         float64 `json:"end_heap_inuse_mib"`
	EndRSSMiB          float64 `json:"end_rss_mib"`
	EndRouterHeapMiB   float64 `json:"end_router_heap_inuse_mib"`
	EndInboxHeapMiB    float64 `json:"end_inbox_heap_inuse_mib"`
	Goroutines         int     `json:"goroutines"`
	// Lists with the one question of Threads threads waiting: the router's
	// first page and the inbox API's (limit 50), p50.
	ClientPageMS float64 `json:"client_page_p50_ms"`
	InboxPageMS  float64 `json:"inbox_page_p50_ms"`
	// The one answer: its reply, then the fan-out it starts. From the
	// answer submitted until the first and the last thread's resumed
	// runtime started (their started events) and until the last finished.
	AnswerReplyMS   float64 `json:"answer_reply_ms"`
	FirstStartedMS  float64 `json:"first_started_ms"`
	MedianStartedMS float64 `json:"median_started_ms"`
	LastStartedMS   float64 `json:"last_started_ms"`
	LastFinishedMS  float64 `json:"last_finished_ms"`
	// ResumedPerSecond is Threads over LastFinishedMS.
	ResumedPerSecond float64 `json:"resumed_per_second"`
	// ExtraResumes counts resumed dispatches per thread beyond one and
	// ExtraFinishes threads that ended more than once: both 0, or the
	// scenario fails. Neither is a second resume: Restarts counts started
	// events of another attempt of a resumed dispatch already started (its
	// work message delivered again), Republished the same started event
	// seen twice on its subject (a publish retried; the stream keeps one).
	ExtraResumes  int     `json:"extra_resumes"`
	ExtraFinishes int     `json:"extra_finishes"`
	Restarts      int     `json:"restarts"`
	Republished   int     `json:"republished"`
	PeakRSSMiB    float64 `json:"peak_rss_mib"`
}

// coalesceQuestion is what every thread of the scenario asks.
const coalesceQuestion = "The config loader: rename it readConfig or parseConfig?"

// coalesceRuntime asks coalesceQuestion on round 0 and finishes on round
// 1, in process.
type coalesceRuntime struct{}

func (coalesceRuntime) Run(_ context.Context, inv worker.Invocation) worker.Result {
	if inv.Request.Round == 0 {
		if err := sentinel.Write(inv.Workspace, sentinel.Request{Question: coalesceQuestion, Options: []string{"readConfig", "parseConfig"}, Kind: sentinel.KindDecision}); err != nil {
			return worker.Result{ExitCode: -1, Err: err}
		}
	}
	return worker.Result{}
}

// Coalesce runs the ask-once scenario on the whole of Agora in this
// process. It fails unless the threads make exactly one waiting question
// listing every one of them, and every thread is resumed once and
// finishes; the error names every dispatch that ended failed or
// cancelled.
func Coalesce(ctx context.Context, cfg CoalesceConfig, progress io.Writer) (CoalesceReport, error) {
	if cfg.Threads <= 0 {
		cfg.Threads = 1000
	}
	if cfg.InFlight <= 0 {
		cfg.InFlight = 64
	}
	if cfg.Slots <= 0 {
		cfg.Slots = 16
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = 5*time.Minute + time.Duration(cfg.Threads)*200*time.Millisecond
	}
	return bounded(ctx, "--scale coalesce", cfg.Deadline, func(ctx context.Context, l *lost) (CoalesceReport, error) {
		return coalesce(ctx, cfg, l, progress)
	})
}

func coalesce(ctx context.Context, cfg CoalesceConfig, l *lost, progress io.Writer) (CoalesceReport, error) {
	say := sayer(progress)
	// The heap profile's sampling rate, from here on: fine enough to split
	// the heap by service.
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 4096
	st, err := startStack(ctx, stackConfig{Slots: cfg.Slots, Runtime: coalesceRuntime{}})
	if err != nil {
		return CoalesceReport{}, err
	}
	defer st.close()
	unwatch, err := l.watch(st.nc)
	if err != nil {
		return CoalesceReport{}, err
	}
	defer unwatch()
	web := httptest.NewServer(st.Handler())
	defer web.Close()
	rep := CoalesceReport{Threads: cfg.Threads}
	rep.StartHeapMiB, rep.StartRSSMiB, _ = memory()
	rep.StartRouterHeapMiB, rep.StartInboxHeapMiB = serviceHeaps()

	// Round 0 of a thread ends with needs_input (frees an asking slot);
	// after the answer, each thread's resumed round starts and finishes.
	k := newAsker(cfg.InFlight)
	var answeredAt time.Time
	started := map[string]time.Duration{} // thread → answer to its resumed run's start
	resumedBy := map[string]string{}      // thread → its resumed dispatch
	startedID := map[string]string{}      // thread → its resumed run's started event id
	finished := map[string]time.Duration{}
	var extraResumes, extraFinishes, restarts, republished int
	allDone := make(chan struct{})
	sub, err := k.subscribe(st.nc, func(a lifecycle.LifecycleAddr, m *nats.Msg) {
		switch {
		case answeredAt.IsZero():
		case a.Kind == lifecycle.KindStarted:
			id := m.Header.Get(jetstream.MsgIDHeader)
			switch d, ok := resumedBy[a.ThreadID]; {
			case !ok:
				started[a.ThreadID], resumedBy[a.ThreadID], startedID[a.ThreadID] = time.Since(answeredAt), a.DispatchID, id
			case d == a.DispatchID && id == startedID[a.ThreadID]:
				republished++
			case d == a.DispatchID:
				restarts++
			default:
				extraResumes++
			}
		case a.Kind == lifecycle.KindFailed || a.Kind == lifecycle.KindCancelled:
			// Lost (l.watch): no thread is done.
		case a.Kind.Terminal():
			if _, ok := finished[a.ThreadID]; ok {
				extraFinishes++
				return
			}
			finished[a.ThreadID] = time.Since(answeredAt)
			if len(finished) == cfg.Threads {
				close(allDone)
			}
		}
	})
	if err != nil {
		return rep, err
	}
	defer func() { _ = sub.Unsubscribe() }()

	say("%d threads ask the same question (%d at once)", cfg.Threads, cfg.InFlight)
	t0 := time.Now()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	if err := k.ask(ctx, st.Client(), cfg.Threads, tick.C, say); err != nil {
		return rep, err
	}
	// Every thread asked and recorded: the router's waiting questions
	// list every thread, on one question or (a failure) on several.
	var q lifecycle.Question
	for deadline := time.Now().Add(5 * time.Minute); ; {
		p, err := st.Client().Waiting(ctx, client.QuestionFilter{}, 50, "")
		if err != nil {
			return rep, err
		}
		threads := 0
		for _, w := range p.Questions {
			threads += max(1, len(w.WaitingThreads))
		}
		if k.count() >= cfg.Threads && threads >= cfg.Threads {
			rep.Waiting = p.Count
			if p.Count != 1 || len(p.Questions) != 1 {
				return rep, fmt.Errorf("bench: %d threads asked the same question and made %d waiting questions, want 1", cfg.Threads, p.Count)
			}
			q = p.Questions[0]
			rep.WaitingThreads = len(q.WaitingThreads)
			break
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("bench: %d of %d threads asked, %d on %d waiting questions after 5 minutes", k.count(), cfg.Threads, threads, p.Count)
		}
		select {
		case <-ctx.Done():
			return rep, stopped(ctx, "%d of %d threads asked, %d on %d waiting questions%s", k.count(), cfg.Threads, threads, p.Count, k.notAsked())
		case <-tick.C:
			say("  %d asked, %d threads on %d waiting questions", k.count(), threads, p.Count)
		case <-time.After(100 * time.Millisecond):
		}
	}
	rep.AskSeconds = time.Since(t0).Seconds()
	if rep.WaitingThreads != cfg.Threads {
		return rep, fmt.Errorf("bench: the one waiting question lists %d threads, want %d", rep.WaitingThreads, cfg.Threads)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		n, _, err := inboxList(ctx, web.URL, st.DevToken(), 1)
		if err != nil {
			return rep, err
		}
		rep.InboxPending = n
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("bench: the inbox shows %d pending questions a minute after the router listed one", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // the router's records and its index settle
	rep.HeapMiB, rep.RSSMiB, rep.Goroutines = memory()
	rep.RouterHeapMiB, rep.InboxHeapMiB = serviceHeaps()
	say("one question, %d threads waiting on it; timing the lists", rep.WaitingThreads)
	if rep.ClientPageMS, err = medianMS(20, func() error {
		_, err := st.Client().Waiting(ctx, client.QuestionFilter{}, 50, "")
		return err
	}); err != nil {
		return rep, err
	}
	if rep.InboxPageMS, err = medianMS(20, func() error { _, _, err := inboxList(ctx, web.URL, st.DevToken(), 50); return err }); err != nil {
		return rep, err
	}

	say("answering it once")
	k.mu.Lock()
	answeredAt = time.Now()
	k.mu.Unlock()
	if _, err := st.Client().Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "readConfig", AnsweredBy: "bench"}); err != nil {
		return rep, fmt.Errorf("answer %s: %w", q.QuestionID, err)
	}
	rep.AnswerReplyMS = ms(time.Since(answeredAt))
	limit := time.After(10 * time.Minute)
	for done := false; !done; {
		select {
		case <-allDone:
			done = true
		case <-ctx.Done():
			k.mu.Lock()
			defer k.mu.Unlock()
			return rep, stopped(ctx, "%d of %d threads resumed and %d finished after the answer", len(started), cfg.Threads, len(finished))
		case <-tick.C:
			k.mu.Lock()
			say("  %d started, %d finished", len(started), len(finished))
			k.mu.Unlock()
		case <-limit:
			k.mu.Lock()
			defer k.mu.Unlock()
			return rep, fmt.Errorf("bench: %d of %d threads resumed and %d finished within 10 minutes of the answer", len(started), cfg.Threads, len(finished))
		}
	}
	time.Sleep(time.Second) // a duplicate would come now
	k.mu.Lock()
	var starts []time.Duration
	for _, d := range started {
		starts = append(starts, d)
	}
	var last time.Duration
	for _, d := range finished {
		last = max(last, d)
	}
	rep.ExtraResumes, rep.ExtraFinishes, rep.Restarts, rep.Republished = extraResumes, extraFinishes, restarts, republished
	k.mu.Unlock()
	if len(starts) != cfg.Threads {
		return rep, fmt.Errorf("bench: %d threads finished, %d resumed runs started, want %d", cfg.Threads, len(starts), cfg.Threads)
	}
	slices.Sort(starts)
	rep.FirstStartedMS, rep.MedianStartedMS, rep.LastStartedMS = ms(starts[0]), percentileMS(starts, 0.5), ms(starts[len(starts)-1])
	rep.LastFinishedMS = ms(last)
	rep.ResumedPerSecond = float64(cfg.Threads) / last.Seconds()
	if rep.ExtraResumes != 0 || rep.ExtraFinishes != 0 {
		return rep, fmt.Errorf("bench: threads resumed more than once: %d extra resumed dispatches, %d extra ends", rep.ExtraResumes, rep.ExtraFinishes)
	}
	rep.EndHeapMiB, rep.EndRSSMiB, _ = memory()
	rep.EndRouterHeapMiB, rep.EndInboxHeapMiB = serviceHeaps()
	rep.PeakRSSMiB = procKiB("VmHWM") / 1024
	return rep, nil
}

// serviceHeaps is the Go heap in use (MiB) allocated under the router's
// code and under the inbox's, from the heap profile after a collection:
// a sampled allocation counts for the service whose package is on its
// stack, scaled as runtime/pprof scales samples.
func serviceHeaps() (router, inbox float64) {
	runtime.GC()
	runtime.GC() // the profile is as of the last completed cycle
	var recs []runtime.MemProfileRecord
	for {
		n, ok := runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:n]
			break
		}
		recs = make([]runtime.MemProfileRecord, n+64)
	}
	rate := float64(runtime.MemProfileRate)
	var r, in float64
	for i := range recs {
		rec := &recs[i]
		objs, bytes := rec.InUseObjects(), rec.InUseBytes()
		if objs == 0 || bytes == 0 {
			continue
		}
		// An object of size s is sampled with probability 1-e^(-s/rate).
		avg := float64(bytes) / float64(objs)
		size := float64(bytes) / (1 - math.Exp(-avg/rate))
		frames := runtime.CallersFrames(rec.Stack())
		for {
			f, more := frames.Next()
			if strings.HasPrefix(f.Function, "github.com/agora-dispatch/agora/services/router.") {
				r += size
				break
			}
			if strings.HasPrefix(f.Function, "github.com/agora-dispatch/agora/answerers/inbox.") {
				in += size
				break
			}
			if !more {
				break
			}
		}
	}
	return r / (1 << 20), in / (1 << 20)
}

// PrintCoalesce writes the report as a table.
func PrintCoalesce(w io.Writer, r CoalesceReport) {
	fmt.Fprintf(w, "%d threads asked the same question in %.1f s: %d waiting question listing %d threads (the inbox shows %d)\n\n",
		r.Threads, r.AskSeconds, r.Waiting, r.WaitingThreads, r.InboxPending)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\t")
	fmt.Fprintf(tw, "Go heap in use, start → all waiting → all finished\t%.1f → %.1f → %.1f MiB\t\n", r.StartHeapMiB, r.HeapMiB, r.EndHeapMiB)
	fmt.Fprintf(tw, "RSS, start → all waiting → all finished\t%.1f → %.1f → %.1f MiB\t\n", r.StartRSSMiB, r.RSSMiB, r.EndRSSMiB)
	fmt.Fprintf(tw, "router's Go heap, start → all waiting → all finished\t%.2f → %.2f → %.2f MiB\t\n", r.StartRouterHeapMiB, r.RouterHeapMiB, r.EndRouterHeapMiB)
	fmt.Fprintf(tw, "inbox's Go heap, start → all waiting → all finished\t%.2f → %.2f → %.2f MiB\t\n", r.StartInboxHeapMiB, r.InboxHeapMiB, r.EndInboxHeapMiB)
	fmt.Fprintf(tw, "goroutines, all waiting\t%d\t\n", r.Goroutines)
	fmt.Fprintf(tw, "router, first page of waiting questions (limit 50), p50\t%.1f ms\t\n", r.ClientPageMS)
	fmt.Fprintf(tw, "inbox API, first page (limit 50), p50\t%.1f ms\t\n", r.InboxPageMS)
	fmt.Fprintf(tw, "the one answer's reply\t%.1f ms\t\n", r.AnswerReplyMS)
	fmt.Fprintf(tw, "answer → first / median / last resumed run started\t%.0f / %.0f / %.0f ms\t\n", r.FirstStartedMS, r.MedianStartedMS, r.LastStartedMS)
	fmt.Fprintf(tw, "answer → every thread finished\t%.0f ms (%.0f threads/s)\t\n", r.LastFinishedMS, r.ResumedPerSecond)
	fmt.Fprintf(tw, "threads resumed or ended more than once\t%d / %d\t\n", r.ExtraResumes, r.ExtraFinishes)
	fmt.Fprintf(tw, "resumed runs started again: another attempt / the same event seen twice\t%d / %d\t\n", r.Restarts, r.Republished)
	fmt.Fprintf(tw, "peak RSS\t%.1f MiB\t\n", r.PeakRSSMiB)
	_ = tw.Flush()
}
