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
 "context": "The API is **overloaded**; see ` + "`retry()`" + ` <script>alert(2)</script>",
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
	d, err := s.c.Dispatch(t.Context(), lifecycle.Request{Subagent: "reviewer"})
	if err != nil {
		t.Fatal(err)
	}
	qid := lifecycle.QuestionID(d.DispatchID)
	s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Pending() })
	p := b.get("/inbox/questions/" + qid)
	mustContain(t, "question page", p.body,
		`<strong>overloaded</strong>`, `<code>retry()</code>`,
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
