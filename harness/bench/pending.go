package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// PendingConfig sizes `agora bench --scale pending`: Questions threads
// ask and wait, unanswered; then the scenario measures what that many
// waiting questions cost (docs/storage.md, "Retention": memory follows
// pending work).
type PendingConfig struct {
	Questions int // default 10000
	InFlight  int // threads asking at once; default 64
	Slots     int // worker slots; default 16
	Samples   int // answers timed at that size; default 20
	// Deadline bounds the whole scenario; default 3 minutes and 20 ms a
	// question. A dispatch that ends failed or cancelled stops it sooner.
	Deadline time.Duration
	// IdleProfile, when set, receives a CPU profile of the idle window
	// (where the idle CPU goes).
	IdleProfile io.Writer
	// runtime is the sub-agent's; default askingRuntime.
	runtime worker.InProcess
}

// PendingReport is the scenario's result.
type PendingReport struct {
	Questions int     `json:"questions"`
	Seconds   float64 `json:"seconds"` // to ask them all
	// Memory of the whole process (dispatcher, worker, router, inbox and
	// the embedded server, as `agora dev`) before and with every question
	// waiting.
	StartHeapMiB   float64 `json:"start_heap_inuse_mib"`
	StartRSSMiB    float64 `json:"start_rss_mib"`
	HeapMiB        float64 `json:"heap_inuse_mib"`
	RSSMiB         float64 `json:"rss_mib"`
	Goroutines     int     `json:"goroutines"`
	IdleCPUPercent float64 `json:"idle_cpu_percent"` // over 10 s with every question waiting
	// List latencies (p50 ms): every waiting question through the SDK's
	// bucket read (client.Questions), the router's first page (limit 50,
	// client.Waiting, as `agora questions`), the inbox API's first page
	// (limit 50) and all of it (limit 10000).
	ClientListMS    float64 `json:"client_list_p50_ms"`
	ClientPageMS    float64 `json:"client_page_p50_ms"`
	ClientPageCount int     `json:"client_page_count"` // the router's count of waiting questions
	InboxPageMS     float64 `json:"inbox_page_p50_ms"`
	InboxAllMS      float64 `json:"inbox_all_p50_ms"`
	// What a person's browser asks: the pending page (HTML, its first
	// AGORA_INBOX_PENDING_ROWS rows) and the live stream's opening sync.
	InboxHTMLMS     float64 `json:"inbox_html_p50_ms"`
	InboxLiveMS     float64 `json:"inbox_live_p50_ms"`
	AnswerP50MS     float64 `json:"answer_p50_ms"` // answer submitted → its thread finished
	AnswerP99MS     float64 `json:"answer_p99_ms"`
	AnswerSamples   int     `json:"answer_samples"`
	PeakRSSMiB      float64 `json:"peak_rss_mib"`
	InboxPending    int     `json:"inbox_pending"`     // what the inbox counted
	ClientListCount int     `json:"client_list_count"` // what the SDK listed
}

// Pending runs the pending-questions scenario on the whole of Agora in
// this process. It returns an error naming every dispatch that ended
// failed or cancelled, and one naming the dispatches that never asked
// when the deadline passes.
func Pending(ctx context.Context, cfg PendingConfig, progress io.Writer) (PendingReport, error) {
	if cfg.Questions <= 0 {
		cfg.Questions = 10000
	}
	if cfg.InFlight <= 0 {
		cfg.InFlight = 64
	}
	if cfg.Slots <= 0 {
		cfg.Slots = 16
	}
	if cfg.Samples <= 0 {
		cfg.Samples = 20
	}
	cfg.Samples = min(cfg.Samples, cfg.Questions)
	if cfg.Deadline <= 0 {
		cfg.Deadline = 3*time.Minute + time.Duration(cfg.Questions)*20*time.Millisecond
	}
	return bounded(ctx, "--scale pending", cfg.Deadline, func(ctx context.Context, l *lost) (PendingReport, error) {
		return pending(ctx, cfg, l, progress)
	})
}

func pending(ctx context.Context, cfg PendingConfig, l *lost, progress io.Writer) (PendingReport, error) {
	say := sayer(progress)
	st, err := startStack(ctx, stackConfig{Slots: cfg.Slots, Runtime: cfg.runtime})
	if err != nil {
		return PendingReport{}, err
	}
	defer st.close()
	unwatch, err := l.watch(st.nc)
	if err != nil {
		return PendingReport{}, err
	}
	defer unwatch()
	web := httptest.NewServer(st.Handler())
	defer web.Close()
	rep := PendingReport{Questions: cfg.Questions}
	rep.StartHeapMiB, rep.StartRSSMiB, _ = memory()

	// A thread's first round ends with needs_input (frees an asking slot)
	// and its second with finished (ends an answer's timing).
	k := newAsker(cfg.InFlight)
	finished := map[string]chan struct{}{}
	sub, err := k.subscribe(st.nc, func(a lifecycle.LifecycleAddr, _ *nats.Msg) {
		if a.Kind != lifecycle.KindFinished {
			return
		}
		if ch, ok := finished[a.ThreadID]; ok {
			close(ch)
			delete(finished, a.ThreadID)
		}
	})
	if err != nil {
		return rep, err
	}
	defer func() { _ = sub.Unsubscribe() }()

	say("asking %d questions (%d threads at once); none is answered", cfg.Questions, cfg.InFlight)
	t0 := time.Now()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	if err := k.ask(ctx, st.Client(), cfg.Questions, tick.C, say); err != nil {
		return rep, err
	}
	// Every question asked, recorded by the router and shown by the inbox.
	for {
		n, _, err := inboxList(ctx, web.URL, st.DevToken(), 1)
		if err != nil && ctx.Err() != nil {
			// The deadline (or a lost dispatch) cut the request: say what
			// was still missing, as the wait below does.
			return rep, stopped(ctx, "%d of %d asked%s", k.count(), cfg.Questions, k.notAsked())
		}
		if err != nil {
			return rep, err
		}
		if k.count() >= cfg.Questions && n >= cfg.Questions {
			rep.InboxPending = n
			break
		}
		select {
		case <-ctx.Done():
			return rep, stopped(ctx, "%d of %d asked, %d in the inbox%s", k.count(), cfg.Questions, n, k.notAsked())
		case <-tick.C:
			say("  %d asked, %d in the inbox", k.count(), n)
		case <-time.After(100 * time.Millisecond):
		}
	}
	rep.Seconds = time.Since(t0).Seconds()
	time.Sleep(time.Second) // the router's records and its index settle
	rep.HeapMiB, rep.RSSMiB, rep.Goroutines = memory()
	say("all %d waiting; measuring idle CPU for 10s", cfg.Questions)
	if cfg.IdleProfile != nil {
		if err := pprof.StartCPUProfile(cfg.IdleProfile); err != nil {
			return rep, err
		}
	}
	rep.IdleCPUPercent = idleCPU(10 * time.Second)
	if cfg.IdleProfile != nil {
		pprof.StopCPUProfile()
	}

	say("timing the lists")
	var qs []lifecycle.Question
	if rep.ClientListMS, err = medianMS(5, func() (err error) {
		qs, err = st.Client().Questions(ctx, client.QuestionFilter{Status: "asked"})
		return err
	}); err != nil {
		return rep, err
	}
	rep.ClientListCount = len(qs)
	if rep.ClientPageMS, err = medianMS(20, func() error {
		p, err := st.Client().Waiting(ctx, client.QuestionFilter{}, 50, "")
		if err == nil {
			rep.ClientPageCount = p.Count
		}
		return err
	}); err != nil {
		return rep, err
	}
	if rep.InboxPageMS, err = medianMS(20, func() error { _, _, err := inboxList(ctx, web.URL, st.DevToken(), 50); return err }); err != nil {
		return rep, err
	}
	if rep.InboxAllMS, err = medianMS(5, func() error { _, _, err := inboxList(ctx, web.URL, st.DevToken(), 10000); return err }); err != nil {
		return rep, err
	}
	if rep.InboxHTMLMS, err = medianMS(20, func() error { return inboxPage(ctx, web.URL+inbox.Prefix+"/", st.DevToken(), "") }); err != nil {
		return rep, err
	}
	if rep.InboxLiveMS, err = medianMS(20, func() error {
		return inboxPage(ctx, web.URL+inbox.Prefix+"/events", st.DevToken(), "sync")
	}); err != nil {
		return rep, err
	}

	say("timing %d answers at that size (answer submitted → thread finished)", cfg.Samples)
	var lat []time.Duration
	for _, q := range qs[:cfg.Samples] {
		ch := make(chan struct{})
		k.mu.Lock()
		finished[q.ThreadID] = ch
		k.mu.Unlock()
		t := time.Now()
		if _, err := st.Client().Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "A", AnsweredBy: "bench"}); err != nil {
			return rep, fmt.Errorf("answer %s: %w", q.QuestionID, err)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return rep, stopped(ctx, "thread %s answered, not finished", q.ThreadID)
		case <-time.After(30 * time.Second):
			return rep, fmt.Errorf("thread %s did not finish within 30s of its answer", q.ThreadID)
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return percentileMS(lat, p) }
	rep.AnswerP50MS, rep.AnswerP99MS, rep.AnswerSamples = pct(0.5), pct(0.99), len(lat)
	rep.PeakRSSMiB = procKiB("VmHWM") / 1024
	return rep, nil
}

// asker dispatches threads of askingSubagent with at most a number of
// them not yet asked at once: a dispatch takes a slot and its thread's
// needs_input frees it.
type asker struct {
	slots chan struct{}
	// mu guards what follows and what the caller's events keep
	// (subscribe).
	mu    sync.Mutex
	asked int
	// sent are the dispatches made, in order; askedBy those whose
	// needs_input came.
	sent    []string
	askedBy map[string]bool
}

func newAsker(inFlight int) *asker {
	return &asker{slots: make(chan struct{}, inFlight), askedBy: map[string]bool{}}
}

// subscribe counts the needs_input events, each freeing a slot, and
// passes every other lifecycle event to other, called with k.mu held.
// The caller unsubscribes.
func (k *asker) subscribe(nc *nats.Conn, other func(a lifecycle.LifecycleAddr, m *nats.Msg)) (*nats.Subscription, error) {
	return nc.Subscribe(lifecycle.SubjectLifecycleAll, func(m *nats.Msg) {
		a, err := lifecycle.ParseLifecycleSubject(m.Subject)
		if err != nil {
			return
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		if a.Kind != lifecycle.KindNeedsInput {
			other(a, m)
			return
		}
		k.asked++
		k.askedBy[a.DispatchID] = true
		select {
		case <-k.slots:
		default: // an event published twice frees nothing more
		}
	})
}

// count is how many needs_input events came.
func (k *asker) count() int { k.mu.Lock(); defer k.mu.Unlock(); return k.asked }

// notAsked names, for an error, the dispatches made that have not asked
// yet (the first maxNamed of them); empty when every one has.
func (k *asker) notAsked() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ids []string
	n := 0
	for _, id := range k.sent {
		if !k.askedBy[id] {
			if n++; n <= maxNamed {
				ids = append(ids, id)
			}
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d dispatched and not asked: %s", n, strings.Join(ids, ", "))
}

// ask dispatches n threads, each once a slot is free, saying how many
// asked on each tick. It returns once the last is dispatched.
func (k *asker) ask(ctx context.Context, c *client.Client, n int, tick <-chan time.Time, say func(string, ...any)) error {
	for i := range n {
		select {
		case k.slots <- struct{}{}:
		case <-ctx.Done():
			return stopped(ctx, "%d of %d dispatched, %d asked%s", i, n, k.count(), k.notAsked())
		}
		d, err := c.Dispatch(ctx, lifecycle.Request{Subagent: askingSubagent})
		if err != nil {
			return fmt.Errorf("dispatch %d: %w", i, err)
		}
		k.mu.Lock()
		k.sent = append(k.sent, d.DispatchID)
		k.mu.Unlock()
		select {
		case <-tick:
			say("  %d / %d asked", k.count(), n)
		default:
		}
	}
	return nil
}

// inboxList asks the inbox API for up to limit pending questions and
// returns how many are pending in all and how many came back.
func inboxList(ctx context.Context, base, token string, limit int) (count, got int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s%s/api/questions?limit=%d", base, inbox.Prefix, limit), nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, 0, fmt.Errorf("inbox: GET questions: %s: %s", resp.Status, b)
	}
	var l inbox.List
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return 0, 0, fmt.Errorf("inbox: GET questions: %w", err)
	}
	return l.Count, len(l.Questions), nil
}

// inboxPage GETs an inbox page as a browser does (the dev token standing
// in for the session) and reads it whole or, when event is set, a live
// stream until that event's data line has arrived.
func inboxPage(ctx context.Context, url, token, event string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("inbox: GET %s: %s", url, resp.Status)
	}
	if event == "" {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	br := bufio.NewReaderSize(resp.Body, 1<<20)
	var inEvent bool
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return fmt.Errorf("inbox: %s ended before its %q event: %w", url, event, err)
		}
		switch {
		case line == "event: "+event+"\n":
			inEvent = true
		case inEvent && strings.HasPrefix(line, "data: "):
			return nil
		}
	}
}

// PrintPending writes the report as a table.
func PrintPending(w io.Writer, r PendingReport) {
	fmt.Fprintf(w, "%d questions waiting (asked in %.0f s); the inbox counts %d, the SDK lists %d, the router counts %d\n\n", r.Questions, r.Seconds, r.InboxPending, r.ClientListCount, r.ClientPageCount)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\t")
	fmt.Fprintf(tw, "Go heap in use, start → all waiting\t%.1f → %.1f MiB\t\n", r.StartHeapMiB, r.HeapMiB)
	fmt.Fprintf(tw, "RSS, start → all waiting\t%.1f → %.1f MiB\t\n", r.StartRSSMiB, r.RSSMiB)
	fmt.Fprintf(tw, "goroutines, all waiting\t%d\t\n", r.Goroutines)
	fmt.Fprintf(tw, "idle CPU, all waiting\t%.2f%% of one core\t\n", r.IdleCPUPercent)
	fmt.Fprintf(tw, "SDK read of every waiting question from the bucket (client.Questions), p50\t%.1f ms\t\n", r.ClientListMS)
	fmt.Fprintf(tw, "router, first page of waiting questions (agora questions, limit 50), p50\t%.1f ms\t\n", r.ClientPageMS)
	fmt.Fprintf(tw, "inbox API, first page (limit 50), p50\t%.1f ms\t\n", r.InboxPageMS)
	fmt.Fprintf(tw, "inbox API, all (limit 10000), p50\t%.1f ms\t\n", r.InboxAllMS)
	fmt.Fprintf(tw, "inbox pending page (HTML, first rows), p50\t%.1f ms\t\n", r.InboxHTMLMS)
	fmt.Fprintf(tw, "inbox live stream, open → first sync, p50\t%.1f ms\t\n", r.InboxLiveMS)
	fmt.Fprintf(tw, "answer → thread finished, p50 / p99 (%d answers)\t%.1f / %.1f ms\t\n", r.AnswerSamples, r.AnswerP50MS, r.AnswerP99MS)
	fmt.Fprintf(tw, "peak RSS\t%.1f MiB\t\n", r.PeakRSSMiB)
	_ = tw.Flush()
}
