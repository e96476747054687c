package inbox_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// reviewer asks a clarification with options, Markdown context and a
// partial state, after leaving a diff, an image and a binary file and
// reporting progress; resumed, it echoes its input.
const reviewer = `if [ "$AGORA_ROUND" -gt 0 ]; then cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"; exit 0; fi
cd "$AGORA_ARTIFACTS_DIR"
printf -- '--- a/x.go\n+++ b/x.go\n@@ -1 +1 @@\n-old <script>alert(1)</script>\n+new\n' > fix.diff
echo iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAEElEQVR4nGNQSFgARwzEcQDMQxIBsLSc1wAAAABJRU5ErkJggg== | base64 -d > plot.png
head -c 100 /dev/zero > blob.bin
echo '{"message":"reviewed the change","percent":80}' >> "$AGORA_PROGRESS_FILE"
cat > "$AGORA_NEEDS_INPUT_FILE" <<'JSON'
{"question": "Which region?", "options": ["eu", "us"], "kind": "clarification",
 "context": "The API is **overloaded**; see ` + "`retry()`" + ` <script>alert(2)</script>\n\n` + "```sh\\nkubectl scale --replicas=3\\n```" + `\n\n<img src=x onerror=\"window.pwned=1\">",
 "partial_state": {"analysis": "<script>x</script>", "n": 3}}
JSON
sleep 0.5`

// The question page shows what the run left: the context as safe Markdown,
// the partial state, the files (a diff inline and escaped, an image inline,
// a binary to download) and the latest progress; free text is taken beside
// the options of a clarification; the history shows thread and round.
func TestQuestionPageShowsTheRun(t *testing.T) {
	s := start(t, options{})
	s.shell("reviewer", reviewer)
	b := s.browser()
	b.login("alice", password)
	d, qid := s.dispatchAsked(lifecycle.Request{Subagent: "reviewer"})
	p := b.get("/inbox/questions/" + qid)
	mustContain(t, "question page", p.body,
		`<strong>overloaded</strong>`, `<code>retry()</code>`, "<pre><code>kubectl scale --replicas=3\n</code></pre>",
		`id="partial-state"`, `&#34;analysis&#34;: &#34;&lt;script&gt;x&lt;/script&gt;&#34;`,
		`<span class="dl del">-old &lt;script&gt;alert(1)&lt;/script&gt;</span>`, `<span class="dl add">&#43;new</span>`,
		`<img class="art-img" src="/inbox/questions/`+qid+`/artifacts/plot.png"`,
		`href="/inbox/questions/`+qid+`/artifacts/blob.bin"`,
		`Latest progress — round 0: 80% reviewed the change`,
		`name="free_answer"`, `id="decline"`)
	mustNotContain(t, "question page", p.body, "<script>alert", "<script>x")

	img := b.get("/inbox/questions/" + qid + "/artifacts/plot.png")
	if img.status != http.StatusOK || img.header.Get("Content-Type") != "image/png" || !strings.HasPrefix(img.header.Get("Content-Disposition"), "inline") ||
		!strings.HasPrefix(img.body, "\x89PNG") {
		t.Errorf("image: %d %v", img.status, img.header)
	}
	bin := b.get("/inbox/questions/" + qid + "/artifacts/blob.bin")
	if bin.status != http.StatusOK || !strings.HasPrefix(bin.header.Get("Content-Disposition"), "attachment") || len(bin.body) != 100 ||
		!strings.Contains(bin.header.Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("binary: %d %v", bin.status, bin.header)
	}
	if nf := b.get("/inbox/questions/" + qid + "/artifacts/nope.txt"); nf.status != http.StatusNotFound {
		t.Errorf("unknown artifact: %d", nf.status)
	}

	// Free text beside the options of a clarification.
	if r := b.post("/inbox/questions/"+qid+"/answer", url.Values{"free": {"1"}, "free_answer": {"neither — use ap-south"}}); r.status != http.StatusSeeOther {
		t.Fatalf("free-text answer: %d %s", r.status, clipBody(r.body))
	}
	out := s.finished(d.ThreadID)
	if string(out["answer"]) != `"neither — use ap-south"` {
		t.Errorf("resumed with %s", out["answer"])
	}
	h := b.get("/inbox/history")
	mustContain(t, "history", h.body, `thread <code>`+d.ThreadID+`</code> · round 0`)
}

// Decline sends a question to its route's fallback, recording who and why;
// a cross-origin POST is refused before anything else.
func TestDeclineAndCrossOrigin(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	_, qid := s.ask("ops-asker", sentinel{Question: "Restart the database?"}, 1)
	b.get("/inbox/questions/" + qid) // the form's CSRF token

	form := url.Values{"reason": {"not my area"}, "csrf": {b.csrf}}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.web.URL+"/inbox/questions/"+qid+"/decline", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if r := b.do(req); r.status != http.StatusForbidden {
		t.Errorf("a cross-site decline: %d", r.status)
	}
	if q := s.waitQuestion(qid, func(*inbox.Question) bool { return true }).Question; q.Route != "ops" {
		t.Fatalf("the cross-site POST moved the question to %s", q.Route)
	}

	p := b.post("/inbox/questions/"+qid+"/decline", url.Values{"reason": {"not my area"}})
	mustContain(t, "decline", p.body, "You declined this question", "fallback route human")
	q := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Route == "human" }).Question
	if !strings.Contains(q.Detail, "declined on route ops by alice: not my area") {
		t.Errorf("detail = %q", q.Detail)
	}
}

// bigState asks a free-text question with a partial state of about 100 KB
// whose last key comes after the first 64 KiB.
const bigState = `if [ "$AGORA_ROUND" -gt 0 ]; then cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"; exit 0; fi
big=$(head -c 100000 /dev/zero | tr '\0' x)
printf '{"question":"Go on?","partial_state":{"notes":"%s","tail":"END-OF-STATE"}}' "$big" > "$AGORA_NEEDS_INPUT_FILE"`

// The question page's parts, each from what a sub-agent sent: Markdown
// context made safe, a partial state cut with a note, a long free-text
// answer cut in the history row, and a decline that no fallback takes.
func TestQuestionPageParts(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)

	t.Run("markdown", func(t *testing.T) {
		ctx := "Load is **high**.\n\n```go\nfmt.Println(\"<hi>\")\n```\n\n" +
			"<img src=x onerror=\"document.title='pwned'\">\n\n" +
			"<script>document.title='pwned'</script>\n\n" +
			"Inline <img src=x onerror=alert(1)> and <a href=\"javascript:alert(1)\" onclick=\"x()\">raw</a>; " +
			"[a link](javascript:alert(1)), ![an image](javascript:alert(1)), [ok](https://example.com/docs).\n"
		_, qid := s.ask("asker", sentinel{Question: "Scale up?", Context: ctx, Options: []string{"yes", "no"}, Kind: "decision"}, 1)
		p := b.get("/inbox/questions/" + qid)
		mustContain(t, "question page", p.body,
			`<strong>high</strong>`, "<pre><code>fmt.Println(&#34;&lt;hi&gt;&#34;)\n</code></pre>",
			`<a href="https://example.com/docs" rel="nofollow">ok</a>`)
		i := strings.Index(p.body, `id="context"`)
		j := i + strings.Index(p.body[max(i, 0):], "</section>") // the context's section ends
		if i < 0 || j < i {
			t.Fatalf("no context section:\n%s", clipBody(p.body))
		}
		mustNotContain(t, "context", p.body[i:j], "<script", "<img src", "onerror", "onclick", "javascript:", "pwned")
		// A decision's options are binding: no free-text field.
		mustNotContain(t, "decision page", p.body, `name="free_answer"`)
	})

	t.Run("partial state cut", func(t *testing.T) {
		s.shell("big-state", bigState)
		_, qid := s.dispatchAsked(lifecycle.Request{Subagent: "big-state"})
		p := b.get("/inbox/questions/" + qid)
		mustContain(t, "question page", p.body, `<details class="block partial" id="partial-state">`, `&#34;notes&#34;: &#34;xxxx`,
			"Cut: the first 64 KiB of 97.7 KiB are shown.")
		mustNotContain(t, "question page", p.body, "END-OF-STATE", `id="partial-state" open`)
		if len(p.body) > 90_000 {
			t.Errorf("the page is %d bytes: the state was not cut", len(p.body))
		}
	})

	t.Run("history snippet", func(t *testing.T) {
		d, qid := s.ask("asker", sentinel{Question: "What should the migration do?"}, 1)
		long := "Split the table first,\nthen backfill in batches of 1000 rows, pausing between batches; " + strings.Repeat("and keep going ", 20) + "UNTIL-THE-END"
		if r := b.post("/inbox/questions/"+qid+"/answer", url.Values{"answer": {long}}); r.status != http.StatusSeeOther {
			t.Fatalf("answer: %d %s", r.status, clipBody(r.body))
		}
		s.finished(d.ThreadID)
		h := b.get("/inbox/history")
		mustContain(t, "history", h.body, `<strong class="answer-text">Split the table first, then backfill in batches of 1000 rows, pausing between b…</strong>`,
			`thread <code>`+d.ThreadID+`</code> · round 0`)
		mustNotContain(t, "history", h.body, "UNTIL-THE-END")
		// The question page has the whole answer.
		mustContain(t, "question page", b.get("/inbox/questions/"+qid).body, "UNTIL-THE-END")
	})

	t.Run("decline without a fallback", func(t *testing.T) {
		_, qid := s.ask("asker", sentinel{Question: "Who owns billing?"}, 1) // route human: no fallback
		b.get("/inbox/questions/" + qid)
		p := b.post("/inbox/questions/"+qid+"/decline", url.Values{"reason": {"not my area"}})
		mustContain(t, "decline", p.body, `<div class="notice notice-warn" role="status">Your decline is recorded, but nobody else takes this question: declined; route human has no fallback`,
			`id="declines"`, `on route human by <strong class="declined-by">alice</strong>: not my area`, `id="answer-form"`)
		q := s.waitQuestion(qid, func(*inbox.Question) bool { return true }).Question
		if !q.Pending() || q.Route != "human" || len(q.Declines) != 1 || q.Declines[0].DeclinedBy != "alice" || q.Declines[0].Reason != "not my area" {
			t.Errorf("after the decline: pending %v, route %s, declines %+v", q.Pending(), q.Route, q.Declines)
		}
	})
}

// Go's http.CrossOriginProtection guards every POST, the login form
// included, before the CSRF tokens are checked; the public URL's origin
// is trusted (a proxy may rewrite Host).
func TestCrossOriginPOSTs(t *testing.T) {
	const public = "http://inbox.example.test:8443"
	s := start(t, options{publicURL: public + "/inbox"})
	b := s.browser()
	b.login("alice", password)
	_, qid := s.ask("ops-asker", sentinel{Question: "Restart it?", Options: []string{"now", "later"}}, 1)
	b.get("/inbox/questions/" + qid)
	q := "/inbox/questions/" + qid
	for _, c := range []struct {
		name, path string
		form       url.Values
	}{
		{"login", "/inbox/login", url.Values{"name": {"alice"}, "password": {password}}},
		{"answer", q + "/answer", url.Values{"answer": {"now"}}},
		{"free answer", q + "/answer", url.Values{"free": {"1"}, "free_answer": {"never"}}},
		{"decline", q + "/decline", url.Values{"reason": {"no"}}},
		{"logout", "/inbox/logout", url.Values{}},
	} {
		for _, hdr := range []map[string]string{
			{"Sec-Fetch-Site": "cross-site"},
			{"Sec-Fetch-Site": "same-site"},
			{"Origin": "https://evil.example"},
		} {
			c.form.Set("csrf", b.csrf) // a valid token: the header check alone refuses
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.web.URL+c.path, strings.NewReader(c.form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			if r := b.do(req); r.status != http.StatusForbidden || !strings.Contains(r.body, "came from another site") {
				t.Errorf("%s with %v: %d %s", c.name, hdr, r.status, clipBody(r.body))
			}
		}
	}
	api := func(hdr map[string]string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.web.URL+"/inbox/api/questions/"+qid+"/answer", strings.NewReader(`{"answer":"now"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(inbox.CSRFHeader, b.csrf)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return b.do(req).status
	}
	if st := api(map[string]string{"Sec-Fetch-Site": "cross-site"}); st != http.StatusForbidden {
		t.Errorf("cross-site API answer: %d", st)
	}
	if d := s.waitQuestion(qid, func(*inbox.Question) bool { return true }); !d.Question.Pending() || d.Question.Route != "ops" {
		t.Fatalf("a refused POST changed the question: %+v", d.Question)
	}
	// The public origin, as a browser on plain HTTP behind a proxy sends
	// it (no Sec-Fetch-Site, Host rewritten): accepted.
	form := url.Values{"answer": {"now"}, "csrf": {b.csrf}}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.web.URL+q+"/answer", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", public)
	if r := b.do(req); r.status != http.StatusSeeOther {
		t.Errorf("answer from the public origin: %d %s", r.status, clipBody(r.body))
	}
}
