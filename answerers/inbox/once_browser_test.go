package inbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chrome is a headless Chromium for one test: do runs steps, text reads
// an element's text, eval a script's value.
type chrome struct {
	t *testing.T
	// ctx bounds the test's steps; browser is the browser's own context,
	// which lives as long as the browser.
	ctx, browser context.Context
}

// newChrome starts headless Chromium (chromium skips or fails the test
// without one); a failing test leaves a screenshot in a temporary
// directory. Call it after start: the browser must close before the
// inbox's web server, which waits for the browser's live streams.
func newChrome(t *testing.T) *chrome {
	t.Helper()
	exe := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1200, 860))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browserCtx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	// The first call starts the browser, which lives as long as its
	// context: no timeout there; the steps get one.
	if err := chromedp.Do(browserCtx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(browserCtx, 2*time.Minute)
	t.Cleanup(cancel)
	// Runs before the browser closes (cleanups run last-in first-out).
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		dir, err := os.MkdirTemp("", "agora-inbox-browser-")
		if err != nil {
			t.Logf("no screenshot: %v", err)
			return
		}
		shot(t, browserCtx, filepath.Join(dir, "failure.png"))
	})
	return &chrome{t: t, ctx: ctx, browser: browserCtx}
}

func (c *chrome) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	if err := chromedp.Do(c.ctx, steps...); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

func (c *chrome) text(sel string) string {
	c.t.Helper()
	v, err := chromedp.Run(c.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		c.t.Fatalf("read %s: %v", sel, err)
	}
	return v
}

func (c *chrome) eval(script string) string {
	c.t.Helper()
	v, err := chromedp.Run(c.ctx, chromedp.Evaluate[string](script))
	if err != nil {
		c.t.Fatalf("%s: %v", script, err)
	}
	return v
}

// signIn signs in with the dev token through the login page.
func (c *chrome) signIn(s *system) {
	c.t.Helper()
	c.do("sign in",
		chromedp.Navigate(s.web.URL+"/inbox/"),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), s.inbox.DevToken()),
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#pending`)),
		chromedp.WaitVisible(chromedp.CSS(`body[data-live="on"]`)),
	)
}

// TestBrowserAskedOnce drives the inbox in headless Chromium: threads
// joining a question make the list show one row, "asked by N threads",
// without a reload (the joined question's row goes); the question's page
// lists the threads and follows its count live; a pending suggestion is
// the focused, marked option with its confidence and rationale, and Enter
// sends it, which resumes the thread with it.
func TestBrowserAskedOnce(t *testing.T) {
	s := start(t, options{dev: true})
	c := newChrome(t) // after start: closed first, ending its live streams
	opts := []string{"readConfig", "parseConfig"}
	dA, qA := s.ask("asker", sentinel{Question: "Rename the config loader: readConfig or parseConfig?", Options: opts, Kind: "decision"}, 1)
	dB, qB := s.ask("asker", sentinel{Question: "Rename the config loader (B)?", Options: opts, Kind: "decision"}, 1)
	c.signIn(s)
	rowA, rowB := `#pending li[data-id="`+qA+`"]`, `#pending li[data-id="`+qB+`"]`
	c.do("see both questions", chromedp.WaitVisible(chromedp.CSS(rowA)), chromedp.WaitVisible(chromedp.CSS(rowB)))

	now := time.Now()
	s.patch(qB, func(rec map[string]any) { rec["status"], rec["joined_to"] = "joined", qA })
	s.patch(qA, func(rec map[string]any) {
		rec["waiting_threads"] = []any{waiting(dA, qA, "asker", now), waiting(dB, qB, "asker", now)}
	})
	c.do("see the joined question go and the count come", chromedp.WaitNotPresent(chromedp.CSS(rowB)),
		chromedp.WaitVisible(chromedp.CSS(rowA+` .threads`)))
	if got := c.text(rowA + ` .threads`); got != "asked by 2 threads" {
		t.Errorf("row says %q", got)
	}
	if got := c.text(`#pending-count`); got != "1" {
		t.Errorf("pending count %q, want 1", got)
	}

	c.do("open the question",
		chromedp.Click(chromedp.CSS(rowA+` a`)),
		chromedp.WaitVisible(chromedp.CSS(`#waiting-threads`)),
		chromedp.WaitVisible(chromedp.CSS(`body[data-live="on"]`)))
	if got := c.text(`#threads-count`); got != "asked by 2 threads" {
		t.Errorf("page says %q", got)
	}
	if got := c.text(`#waiting-threads tr[data-thread="` + dB.ThreadID + `"]`); !strings.Contains(got, dB.DispatchID) || !strings.Contains(got, "its question") {
		t.Errorf("B's row = %q", got)
	}
	// A third thread joins while the page is open.
	dC, qC := s.ask("asker", sentinel{Question: "Rename the config loader (C)?", Options: opts, Kind: "decision"}, 1)
	s.patch(qC, func(rec map[string]any) { rec["status"], rec["joined_to"] = "joined", qA })
	s.patch(qA, func(rec map[string]any) {
		rec["waiting_threads"] = []any{waiting(dA, qA, "asker", now), waiting(dB, qB, "asker", now), waiting(dC, qC, "asker", now)}
	})
	c.do("see the count and the table follow", chromedp.WaitVisible(chromedp.CSS(`#threads-count[data-threads="3"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#waiting-threads tr[data-thread="`+dC.ThreadID+`"]`)))
	if got := c.text(`#waiting-threads tr[data-thread="` + dC.ThreadID + `"]`); !strings.Contains(got, dC.DispatchID) || !strings.Contains(got, "its question") {
		t.Errorf("C's row = %q", got)
	}
	if got := c.text(`#threads-count`); got != "asked by 3 threads" {
		t.Errorf("page says %q after C joined", got)
	}

	// The route's answerer suggested parseConfig, below auto_accept.
	s.patch(qA, func(rec map[string]any) {
		rec["suggestion"] = map[string]any{"answer": "parseConfig", "confidence": 0.72, "rationale": "the other loaders are parse*",
			"by": "agent", "at": now.UTC().Format(time.RFC3339Nano), "accepted": false}
	})
	c.do("reload with the suggestion",
		chromedp.Navigate(s.web.URL+"/inbox/questions/"+qA),
		chromedp.WaitVisible(chromedp.CSS(`#suggestion`)))
	if got := c.text(`#suggestion`); !strings.Contains(got, "72%") || !strings.Contains(got, "the other loaders are parse*") || !strings.Contains(got, "agent") {
		t.Errorf("suggestion = %q", got)
	}
	if got := c.eval(`document.activeElement.className + ' ' + document.activeElement.value`); got != "option suggested parseConfig" {
		t.Errorf("focused element = %q, want the suggested option", got)
	}
	c.do("send the suggestion with Enter",
		chromedp.KeyEvent("\r"),
		chromedp.WaitVisible(chromedp.CSS(`#outcome`)))
	if got := c.text(`#outcome .outcome-answer`); got != "parseConfig" {
		t.Errorf("outcome = %q", got)
	}
	if out := s.finished(dA.ThreadID); string(out["answer"]) != `"parseConfig"` {
		t.Errorf("A resumed with %s", out["answer"])
	}
}

// TestBrowserThirtyThreadsAskOnce is the whole of asking once, in
// headless Chromium against the real dispatcher, worker and router: 30
// threads ask the same question on a route that remembers; the list shows
// one question, "asked by 30 threads" (counted up live as they join); its
// page lists the 30 threads; one click answers it and every thread
// finishes with that answer; the decisions page then lists the
// remembered answer, and its Forget button forgets it.
func TestBrowserThirtyThreadsAskOnce(t *testing.T) {
	s := start(t, options{dev: true})
	c := newChrome(t)
	c.signIn(s)
	const n = 30
	threads := make([]string, 0, n)
	for range n {
		d, err := s.c.Dispatch(t.Context(), lifecycleRequest("memo-asker", memoQuestion))
		if err != nil {
			t.Fatal(err)
		}
		threads = append(threads, d.ThreadID)
	}
	err := chromedp.Do(c.ctx, chromedp.WaitVisible(chromedp.CSS(`#pending li[data-id]`)),
		chromedp.Poll[chromedp.Void](`(() => { const t = document.querySelector('#pending li[data-id] .threads'); return t && t.textContent === 'asked by 30 threads' })()`,
			chromedp.WithPollingTimeout(waitFor)))
	if err != nil {
		l := s.listAPI("")
		t.Fatalf("see one question asked by 30 threads: %v; the page shows %q; the API lists %d questions", err,
			c.eval(`document.getElementById('pending').innerText`), len(l.Questions))
	}
	if got := c.eval(`String(document.querySelectorAll('#pending li[data-id]').length) + ' ' + document.getElementById('pending-count').textContent`); got != "1 1" {
		t.Errorf("rows and count = %q, want one question", got)
	}
	c.do("open it",
		chromedp.Click(chromedp.CSS(`#pending li[data-id] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#waiting-threads`)))
	if got := c.eval(`String(document.querySelectorAll('#waiting-threads tbody tr').length)`); got != "30" {
		t.Errorf("%s threads listed, want 30", got)
	}
	c.do("answer once",
		chromedp.Click(chromedp.CSS(`button.option[value="parseConfig"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#outcome`)))
	for _, th := range threads {
		if out := s.finished(th); string(out["answer"]) != `"parseConfig"` || string(out["answered_by"]) != `"dev"` {
			t.Errorf("thread %s resumed with %s by %s", th, out["answer"], out["answered_by"])
		}
	}

	s.waitDecisions(s.bearer, 1)
	c.do("open the remembered decisions",
		chromedp.Navigate(s.web.URL+"/inbox/decisions"),
		chromedp.WaitVisible(chromedp.CSS(`#decisions tbody tr`)))
	if got := c.text(`#decisions tbody tr`); !strings.Contains(got, "memo") || !strings.Contains(got, "parseConfig") || !strings.Contains(got, "dev") {
		t.Errorf("decision row = %q", got)
	}
	c.do("forget it",
		chromedp.Click(chromedp.CSS(`#decisions button.forget`)),
		chromedp.WaitVisible(chromedp.CSS(`#decisions-notice`)),
		chromedp.WaitVisible(chromedp.CSS(`#no-decisions`)))
	if l := s.decisionsAPI(s.bearer, ""); l.Count != 0 {
		t.Errorf("still remembered: %+v", l.Decisions)
	}
}
