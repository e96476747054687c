package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// chromium finds Debian's chromium. Without it the browser test skips,
// except in CI (CI=true), where it fails: .ci/run installs it.
func chromium(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium is required in CI (apt-get install chromium): %v", err)
		}
		t.Skipf("no chromium to drive (apt-get install chromium): %v", err)
	}
	return path
}

// TestBrowser drives the inbox in real headless Chromium against the real
// dispatcher, router and worker: sign in with the dev token, watch
// questions appear (and one answered elsewhere disappear) without a
// reload, open one, click an option, and see the thread resume and
// finish. Set AGORA_INBOX_SCREENSHOTS=<dir> to keep screenshots of the
// pages; on failure one is saved to a temporary directory.
func TestBrowser(t *testing.T) {
	s := start(t, options{dev: true})
	c := newChrome(t) // after start: closed first, ending its live streams
	ctx := c.ctx
	keep := os.Getenv("AGORA_INBOX_SCREENSHOTS")
	snap := func(name string) {
		if keep != "" {
			shot(t, c.browser, filepath.Join(keep, name+".png"))
		}
	}
	run := c.do
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	value := func(what string, a chromedp.Action[string]) string {
		t.Helper()
		v, err := chromedp.Run(ctx, a)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}

	// Sign in with one click on the link the inbox prints: the token
	// rides in the fragment, is posted by the login form, and is gone
	// from the address bar. (Typing it is TestBrowserAskedOnce's sign-in.)
	run("sign in from the printed link",
		chromedp.Navigate(inbox.LoginLink(s.web.URL, s.inbox.DevToken())),
		chromedp.WaitVisible(css(`#pending`)),
		chromedp.WaitVisible(css(`body[data-live="on"]`)),
		chromedp.WaitVisible(css(`#empty`)),
	)
	if href := value("read the address", chromedp.Evaluate[string](`location.href`)); strings.Contains(href, s.inbox.DevToken()) || !strings.HasSuffix(href, "/inbox/") {
		t.Errorf("after signing in from the link the address is %q", href)
	}
	snap("empty")
	// A mark that a reload would wipe out.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.agoraTestMark = true`)); err != nil {
		t.Fatal(err)
	}

	// A question appears without a reload.
	in, _ := json.Marshal(sentinel{
		Question: "Rewrite function parseConfig in place, or add parseConfigV2 next to it?",
		Options:  []string{"Rewrite in place", "Add parseConfigV2"},
		Context:  "parseConfig has 14 call sites in 6 packages.\nThe signature stays the same either way.\n\nRewriting in place touches less code; a V2 keeps the old behaviour for the CLI.",
		Kind:     "decision",
	})
	d, err := s.c.Dispatch(t.Context(), lifecycle.Request{Subagent: "asker", Input: in, Target: "github.com/acme/app"})
	if err != nil {
		t.Fatal(err)
	}
	qid := lifecycle.QuestionID(d.DispatchID)
	row := `#pending li[data-id="` + qid + `"]`
	run("see the question arrive", chromedp.WaitVisible(css(row)))
	// Another, answered elsewhere, disappears without a reload.
	_, other := s.ask("ops-asker", sentinel{Question: "Which region is primary: eu-west or us-east?"}, 1)
	otherRow := `#pending li[data-id="` + other + `"]`
	run("see the second question arrive", chromedp.WaitVisible(css(otherRow)))
	snap("pending")
	if st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+other+"/answer", map[string]string{"answer": "eu-west"}, map[string]string{"Authorization": "Bearer " + s.bearer}); st != http.StatusOK {
		t.Fatalf("answer elsewhere: %d %s", st, body)
	}
	run("see the answered question go", chromedp.WaitNotPresent(css(otherRow)))
	mark, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.agoraTestMark === true`))
	if err != nil {
		t.Fatal(err)
	}
	count := value("read the count", chromedp.Text(css(`#pending-count`)))
	if !mark {
		t.Fatal("the page reloaded")
	}
	if count != "1" {
		t.Errorf("pending count = %q, want 1", count)
	}

	// Open it and click an option.
	run("open the question",
		chromedp.Click(css(row+` a`)),
		chromedp.WaitVisible(css(`#answer-form`)),
		chromedp.WaitVisible(css(`body[data-live="on"]`)),
	)
	snap("question")
	run("answer",
		chromedp.Click(css(`button.option[value="Add parseConfigV2"]`)),
		chromedp.WaitVisible(css(`#outcome`)),
	)
	outcome := value("read the outcome", chromedp.Text(css(`#outcome`)))
	if !strings.Contains(outcome, "Add parseConfigV2") || !strings.Contains(outcome, "dev") {
		t.Errorf("outcome = %q", outcome)
	}

	// The thread resumes and finishes with the answer…
	out := s.finished(d.ThreadID)
	if string(out["answer"]) != `"Add parseConfigV2"` || string(out["answered_by"]) != `"dev"` {
		t.Errorf("round 1 input = %v", out)
	}
	// …and the page follows it there.
	run("see the thread finish", chromedp.WaitVisible(css(`#thread li[data-status="finished"]`)))
	snap("answered")

	// The keyboard: 1 picks the first option.
	d2, q2 := s.ask("asker", sentinel{Question: "Run the migration now?", Options: []string{"now", "tonight"}}, 1)
	run("answer with the keyboard",
		chromedp.Navigate(s.web.URL+"/inbox/questions/"+q2),
		chromedp.WaitVisible(css(`#answer-form`)),
		chromedp.KeyEvent("1"),
		chromedp.WaitVisible(css(`#outcome`)),
	)
	if out := s.finished(d2.ThreadID); string(out["answer"]) != `"now"` {
		t.Errorf("keyboard answer = %s", out["answer"])
	}

	// What a run left, as a person sees it: Markdown context (bold, code),
	// the diff escaped and coloured, the image shown, no script run.
	s.shell("reviewer", reviewer)
	d3, q3 := s.dispatchAsked(lifecycle.Request{Subagent: "reviewer"})
	run("open a question with files",
		chromedp.Navigate(s.web.URL+"/inbox/questions/"+q3),
		chromedp.WaitVisible(css(`#artifacts pre.diff`)),
	)
	snap("run")
	// The context's Markdown: bold, a fenced block as <pre><code>, and
	// nothing of its <script> and <img onerror> in the page or run.
	code := value("read the code block", chromedp.Text(css(`#context pre > code`)))
	if !strings.Contains(code, "kubectl scale --replicas=3") {
		t.Errorf("code block = %q", code)
	}
	clean, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelectorAll('#context script, #context img, #context [onerror], #context [onclick]').length === 0 && window.pwned === undefined`))
	if err != nil || !clean {
		t.Errorf("the context carries markup that could run (or ran): %v", err)
	}
	bold := value("read the bold context", chromedp.Text(css(`#context strong`)))
	del := value("read the diff", chromedp.Text(css(`#artifacts .dl.del`)))
	title := value("read the title", chromedp.Title())
	if bold != "overloaded" || del != "-old <script>alert(1)</script>" || strings.Contains(title, "alert") {
		t.Errorf("bold %q, diff line %q, title %q", bold, del, title)
	}
	loaded, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const i = document.querySelector('#artifacts img.art-img'); return i.complete && i.naturalWidth === 4 })()`))
	if err != nil || !loaded {
		t.Errorf("the image did not load: %v", err)
	}
	// The partial state, opened, is a plain block, not a status pill.
	run("open the partial state", chromedp.Click(css(`#partial-state summary`)), chromedp.WaitVisible(css(`#partial-state pre.json`)))
	if look := value("read the partial state's look", chromedp.Evaluate[string](`(() => { const st = getComputedStyle(document.getElementById('partial-state')); return st.borderRadius + ' ' + st.backgroundColor })()`)); look != "0px rgba(0, 0, 0, 0)" {
		t.Errorf("the opened partial state's border radius and background are %q, want a plain block (0px, transparent)", look)
	}
	// Decline it: its route (human) has no fallback, and the page says
	// so, names who declined, and still takes an answer.
	run("decline",
		chromedp.Click(css(`#decline summary`)),
		chromedp.SendKeys(css(`#decline-reason`), "needs the data team"),
		chromedp.Click(css(`#decline-button`)),
		chromedp.WaitVisible(css(`.notice`)),
	)
	snap("declined-no-fallback")
	if n := value("read the notice", chromedp.Text(css(`.notice.notice-warn`))); !strings.Contains(n, "nobody else takes this question") || !strings.Contains(n, "no fallback") {
		t.Errorf("notice after decline = %q", n)
	}
	if by := value("read who declined", chromedp.Text(css(`#declines .declined-by`))); by != "dev" {
		t.Errorf("declined by %q", by)
	}
	// The options of a clarification are suggestions: an answer in one's
	// own words, sent with Ctrl+Enter from its field.
	run("answer in my own words",
		chromedp.WaitVisible(css(`#free-answer`)),
		chromedp.SendKeys(css(`#free-answer`), "neither: ap-south"),
		chromedp.KeyEvent("\r", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.WaitVisible(css(`#outcome`)),
	)
	if out := s.finished(d3.ThreadID); string(out["answer"]) != `"neither: ap-south"` {
		t.Errorf("free-text answer = %s", out["answer"])
	}

	// A question on a route with a fallback (ops → human), declined with
	// Ctrl+Enter from the reason field: it moves.
	_, q4 := s.ask("ops-asker", sentinel{Question: "Rotate the database password?"}, 1)
	run("decline to the fallback",
		chromedp.Navigate(s.web.URL+"/inbox/questions/"+q4),
		chromedp.WaitVisible(css(`#answer-form`)),
		chromedp.Click(css(`#decline summary`)),
		chromedp.SendKeys(css(`#decline-reason`), "not ops"),
		chromedp.KeyEvent("\r", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.WaitVisible(css(`.notice.notice-ok`)),
	)
	snap("declined-to-fallback")
	if n := value("read the notice", chromedp.Text(css(`.notice.notice-ok`))); !strings.Contains(n, "fallback route human") {
		t.Errorf("notice after the decline to the fallback = %q", n)
	}
	if q := s.waitQuestion(q4, func(q *inbox.Question) bool { return q.Route == "human" }).Question; !strings.Contains(q.Detail, "declined on route ops by dev: not ops") {
		t.Errorf("detail = %q", q.Detail)
	}

	// Pages with no live rows of their own (the history, an answered
	// question) still show Live and keep the header's count current.
	for _, page := range []string{"/inbox/history", "/inbox/questions/" + qid} {
		run("open "+page,
			chromedp.Navigate(s.web.URL+page),
			chromedp.WaitVisible(css(`body[data-live="on"]`)),
		)
		if mark := value("read the Live mark on "+page, chromedp.Text(css(`#live`))); mark != "Live" {
			t.Errorf("%s: the Live mark reads %q", page, mark)
		}
		before := value("read the count on "+page, chromedp.Text(css(`#pending-count`)))
		n, err := strconv.Atoi(before)
		if err != nil {
			t.Fatalf("%s: the count reads %q", page, before)
		}
		s.ask("asker", sentinel{Question: "One more on " + page + "?"}, 1)
		run("see the count follow on "+page, chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.getElementById('pending-count').textContent === %q`, strconv.Itoa(n+1)), chromedp.WithPollingTimeout(30*time.Second)))
	}
}

// shot saves a full-page PNG of the browser's current page.
func shot(t *testing.T, browserCtx context.Context, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(browserCtx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("no screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Logf("no screenshot: %v", err)
		return
	}
	t.Logf("screenshot: %s", path)
}
