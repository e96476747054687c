package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// patch rewrites question qid's record in the agora_questions bucket, as
// the router does when a thread joins or leaves it (compare-and-set on
// the record's revision), and waits until the inbox shows the change.
func (s *system) patch(qid string, change func(rec map[string]any)) {
	s.t.Helper()
	kv := s.bucket(lifecycle.BucketQuestions)
	for attempt := 0; ; attempt++ {
		e, err := kv.Get(s.t.Context(), qid)
		if err != nil {
			s.t.Fatalf("record %s: %v", qid, err)
		}
		var rec map[string]any
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			s.t.Fatal(err)
		}
		change(rec)
		b, _ := json.Marshal(rec)
		rev, err := kv.Update(s.t.Context(), qid, b, e.Revision())
		if err == nil {
			s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Revision >= rev })
			return
		}
		if attempt == 5 {
			s.t.Fatalf("update %s: %v", qid, err)
		}
	}
}

// waiting is a waiting_threads entry for thread d's question qid.
func waiting(d *client.Dispatch, qid, subagent string, at time.Time) map[string]any {
	return map[string]any{"question_id": qid, "dispatch_id": d.DispatchID, "thread_id": d.ThreadID, "subagent": subagent, "asked_at": at.UTC().Format(time.RFC3339Nano)}
}

// TestAskedByManyThreads: a question several threads wait on (the
// router's waiting_threads, as written when threads join it) shows "asked
// by N threads" in the list and on its page, which lists each thread with
// a link to its own question; a joined question is never listed as
// waiting (nor as closed), and its page points to the question it joined;
// the JSON API returns the threads.
func TestAskedByManyThreads(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	opts := []string{"readConfig", "parseConfig"}
	dA, qA := s.ask("asker", sentinel{Question: "Rename the config loader: readConfig or parseConfig?", Options: opts, Kind: "decision"}, 1)
	dB, qB := s.ask("asker", sentinel{Question: "Rename the config loader (B)?", Options: opts, Kind: "decision"}, 1)
	dC, qC := s.ask("asker", sentinel{Question: "Rename the config loader (C)?", Options: opts, Kind: "decision"}, 1)
	now := time.Now()
	// B and C join A.
	for _, q := range []string{qB, qC} {
		s.patch(q, func(rec map[string]any) { rec["status"], rec["joined_to"] = inbox.StatusJoined, qA })
	}
	s.patch(qA, func(rec map[string]any) {
		rec["waiting_threads"] = []any{waiting(dA, qA, "asker", now), waiting(dB, qB, "asker", now), waiting(dC, qC, "asker", now)}
	})

	// The API: one waiting question, with its three threads.
	l := s.listAPI("")
	if len(l.Questions) != 1 || l.Count != 1 || l.Questions[0].QuestionID != qA {
		t.Fatalf("pending list = %d %+v", l.Count, l.Questions)
	}
	wt := l.Questions[0].WaitingThreads
	if len(wt) != 3 || wt[1].DispatchID != dB.DispatchID || wt[1].ThreadID != dB.ThreadID || wt[2].QuestionID != qC || wt[0].Subagent != "asker" {
		t.Errorf("waiting_threads = %+v", wt)
	}
	for _, st := range []string{"closed", "answered"} {
		for _, q := range s.listAPI("status=" + st).Questions {
			if q.QuestionID == qB || q.QuestionID == qC {
				t.Errorf("status=%s lists the joined question %s", st, q.QuestionID)
			}
		}
	}
	if j := s.listAPI("status=joined"); len(j.Questions) != 2 || j.Questions[0].JoinedTo != qA {
		t.Errorf("status=joined = %+v", j.Questions)
	}
	if d := s.waitQuestion(qB, func(*inbox.Question) bool { return true }); d.Question.Status != inbox.StatusJoined || d.Question.JoinedTo != qA {
		t.Errorf("joined question's detail = %+v", d.Question)
	}

	// The pages.
	p := b.get("/inbox/")
	mustContain(t, "pending page", p.body, "asked by 3 threads", "1 waiting, newest first.", `data-id="`+qA+`"`)
	mustNotContain(t, "pending page", p.body, `data-id="`+qB+`"`, `data-id="`+qC+`"`)
	p = b.get("/inbox/questions/" + qA)
	mustContain(t, "question page", p.body, `id="threads-count" data-threads="3">asked by 3 threads`, `id="waiting-threads"`,
		"<code>"+dB.DispatchID+"</code>", "<code>"+dC.ThreadID+"</code>", `href="/inbox/questions/`+qB+`">its question</a>`, "asked it", `id="answer-form"`)
	p = b.get("/inbox/questions/" + qB)
	mustContain(t, "joined question page", p.body, `id="joined-to"`, `<a href="/inbox/questions/`+qA+`">`+qA+`</a>`)
	mustNotContain(t, "joined question page", p.body, `id="answer-form"`)
	mustNotContain(t, "history page", b.get("/inbox/history").body, qB, qC)

	// C's thread leaves: the count follows.
	s.patch(qA, func(rec map[string]any) {
		rec["waiting_threads"] = []any{waiting(dA, qA, "asker", now), waiting(dB, qB, "asker", now)}
	})
	mustContain(t, "pending page", b.get("/inbox/").body, "asked by 2 threads")
	// Alone again: no count at all.
	s.patch(qA, func(rec map[string]any) { delete(rec, "waiting_threads") })
	p = b.get("/inbox/")
	mustNotContain(t, "pending page", p.body, "asked by")
	if l := s.listAPI(""); len(l.Questions) != 1 || l.Questions[0].WaitingThreads != nil {
		t.Errorf("after the others left: %+v", l.Questions)
	}
}

// TestSuggestionPreselected: a question that came to people with an
// answerer's suggestion (not accepted) shows the answer form with it
// preselected — the option marked and focused, the decision's button, or
// the text filled in — with its confidence and rationale; an accepted
// suggestion is not offered.
func TestSuggestionPreselected(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	suggest := func(qid, answer string, accepted bool) {
		s.patch(qid, func(rec map[string]any) {
			rec["suggestion"] = map[string]any{"answer": answer, "confidence": 0.72, "rationale": "parseConfig matches the other parse* helpers",
				"by": "agent", "at": time.Now().UTC().Format(time.RFC3339Nano), "accepted": accepted}
		})
	}
	_, qOpt := s.ask("asker", sentinel{Question: "readConfig or parseConfig?", Options: []string{"readConfig", "parseConfig"}, Kind: "decision"}, 1)
	suggest(qOpt, "parseConfig", false)
	p := b.get("/inbox/questions/" + qOpt)
	mustContain(t, "options page", p.body, `id="suggestion"`, `<strong class="suggestion-confidence">72%</strong>`, "parseConfig matches the other parse* helpers",
		`class="option suggested" autofocus aria-describedby="suggestion" name="answer" value="parseConfig"`,
		`class="option" name="answer" value="readConfig"`)
	mustContain(t, "pending page", b.get("/inbox/").body, "suggested: parseConfig (72%)")
	if n := len(regexp.MustCompile(`autofocus`).FindAllString(p.body, -1)); n != 1 {
		t.Errorf("%d autofocus attributes", n)
	}

	_, qFree := s.ask("asker", sentinel{Question: "What should the loader be called?"}, 1)
	suggest(qFree, "parseConfig", false)
	mustContain(t, "free-text page", b.get("/inbox/questions/"+qFree).body,
		`<textarea id="answer-text" name="answer" rows="5" required autofocus>parseConfig</textarea>`, `id="suggestion"`)

	_, qClar := s.ask("asker", sentinel{Question: "Which name, if any?", Options: []string{"readConfig", "parseConfig"}, Kind: "clarification"}, 1)
	suggest(qClar, "loadConfig", false)
	mustContain(t, "clarification page", b.get("/inbox/questions/"+qClar).body,
		`<textarea name="free_answer" id="free-answer" rows="2">loadConfig</textarea>`)

	_, qApp := s.ask("asker", sentinel{Question: "Approve the rename?", Kind: "approval"}, 1)
	suggest(qApp, "reject", false)
	p = b.get("/inbox/questions/" + qApp)
	mustContain(t, "approval page", p.body, `class="btn btn-reject suggested" autofocus name="decision" value="reject"`, `class="btn btn-approve" name="decision" value="approve"`)

	_, qAcc := s.ask("asker", sentinel{Question: "Accepted already?", Options: []string{"yes", "no"}}, 1)
	suggest(qAcc, "yes", true)
	mustNotContain(t, "accepted suggestion page", b.get("/inbox/questions/"+qAcc).body, `id="suggestion"`, "suggested")

	// Sending the preselected option answers with it.
	if p := b.post("/inbox/questions/"+qOpt+"/answer", url.Values{"answer": {"parseConfig"}}); p.status != http.StatusSeeOther {
		t.Fatalf("answer: %d %s", p.status, clipBody(p.body))
	}
	if d := s.waitQuestion(qOpt, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered }); d.Question.Answer != "parseConfig" || d.Question.Suggestion == nil {
		t.Errorf("answered: %+v", d.Question)
	}
}

// TestAnsweredFromMemory: a question answered from a remembered decision
// says whose decision it reused and when, on its page, in the history and
// in the JSON API.
func TestAnsweredFromMemory(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	_, qOld := s.ask("asker", sentinel{Question: "readConfig or parseConfig?", Options: []string{"readConfig", "parseConfig"}}, 1)
	if _, err := s.c.Answer(t.Context(), qOld, lifecycle.Answer{Answer: "parseConfig", AnsweredBy: "bob"}); err != nil {
		t.Fatal(err)
	}
	_, qNew := s.ask("asker", sentinel{Question: "readConfig or parseConfig? (tomorrow)", Options: []string{"readConfig", "parseConfig"}}, 1)
	if _, err := s.c.Answer(t.Context(), qNew, lifecycle.Answer{Answer: "parseConfig", AnsweredBy: "memory:" + qOld}); err != nil {
		t.Fatal(err)
	}
	s.waitQuestion(qNew, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered })
	made := time.Date(2026, 11, 26, 9, 30, 0, 0, time.UTC)
	s.patch(qNew, func(rec map[string]any) {
		rec["reused"] = map[string]any{"question_id": qOld, "answered_by": "bob", "answered_at": made.Format(time.RFC3339)}
	})
	want := fmt.Sprintf("answered from the decision of <a href=\"/inbox/questions/%s\">%s</a> by <strong>bob</strong> at <time datetime=\"2026-11-26T09:30:00.000Z\" data-local>2026-11-26 09:30:00 UTC</time>", qOld, qOld)
	mustContain(t, "answered page", b.get("/inbox/questions/"+qNew).body, `id="reused"`, want, "memory:"+qOld)
	mustContain(t, "history page", b.get("/inbox/history").body, "answered from the decision of "+qOld+" by bob at")
	d := s.waitQuestion(qNew, func(*inbox.Question) bool { return true })
	if r := d.Question.Reused; r == nil || r.QuestionID != qOld || r.AnsweredBy != "bob" || !r.AnsweredAt.Equal(made) {
		t.Errorf("reused = %+v", r)
	}
}

// lifecycleRequest is a dispatch of sub-agent sa asking q.
func lifecycleRequest(sa string, q sentinel) lifecycle.Request {
	in, _ := json.Marshal(q)
	return lifecycle.Request{Subagent: sa, Input: in}
}

// TestThirtyThreadsOneQuestion: 30 threads asking the same question are
// one waiting question in the list and the JSON API, with the 30 threads
// (dispatch and thread ids); the 29 that joined are listed with
// status=joined only. One answer through the inbox resumes each thread
// exactly once with that answer, and each joined question is answered
// too.
func TestThirtyThreadsOneQuestion(t *testing.T) {
	s := start(t, options{})
	const n = 30
	q := sentinel{Question: "Rename the config loader: readConfig or parseConfig?", Options: []string{"readConfig", "parseConfig"}, Kind: "decision"}
	byThread := map[string]*client.Dispatch{}
	for range n {
		d, err := s.c.Dispatch(t.Context(), lifecycleRequest("asker", q))
		if err != nil {
			t.Fatal(err)
		}
		byThread[d.ThreadID] = d
	}
	var l inbox.List
	testkit.Eventually(t, waitFor, "one question with 30 threads", func() bool {
		l = s.listAPI("")
		return len(l.Questions) == 1 && len(l.Questions[0].WaitingThreads) == n
	})
	asked := l.Questions[0]
	if l.Count != 1 {
		t.Errorf("count %d, want 1", l.Count)
	}
	for _, w := range asked.WaitingThreads {
		if d := byThread[w.ThreadID]; d == nil || d.DispatchID != w.DispatchID || w.QuestionID != lifecycle.QuestionID(w.DispatchID) {
			t.Errorf("waiting thread %+v is none of the 30", w)
		}
	}
	if j := s.listAPI("status=joined"); len(j.Questions) != n-1 {
		t.Errorf("%d joined questions listed, want %d", len(j.Questions), n-1)
	}
	b := s.browser()
	b.login("alice", password)
	mustContain(t, "pending page", b.get("/inbox/").body, "asked by 30 threads", "1 waiting, newest first.")

	if st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+asked.QuestionID+"/answer", map[string]string{"answer": "parseConfig"},
		map[string]string{"Authorization": "Bearer " + s.bearer}); st != http.StatusOK {
		t.Fatalf("answer: %d %s", st, body)
	}
	for th, d := range byThread {
		if out := s.finished(th); string(out["answer"]) != `"parseConfig"` || string(out["answered_by"]) != `"alice"` {
			t.Errorf("thread %s resumed with %s by %s", th, out["answer"], out["answered_by"])
		}
		view, err := s.c.Thread(t.Context(), th)
		if err != nil || len(view.Rounds) != 2 {
			t.Errorf("thread %s: %v, %d rounds, want the question's and one re-dispatch", th, err, len(view.Rounds))
		}
		qd := s.waitQuestion(lifecycle.QuestionID(d.DispatchID), func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered })
		if qd.Question.Answer != "parseConfig" || qd.Question.AnsweredBy != "alice" {
			t.Errorf("question of %s = %+v", th, qd.Question.Question)
		}
	}
	if l := s.listAPI(""); len(l.Questions) != 0 {
		t.Errorf("still waiting: %+v", l.Questions)
	}
	mustContain(t, "the answered question's page", b.get("/inbox/questions/"+asked.QuestionID).body, `<span id="answered-threads">, for the 30 threads waiting</span>`)
	// The history has each thread's answer, the joined ones marked.
	h := b.get("/inbox/history").body
	if got := strings.Count(h, "asked once with <code>"+asked.QuestionID+"</code>"); got != n-1 {
		t.Errorf("the history marks %d questions as asked once with %s, want %d", got, asked.QuestionID, n-1)
	}
}

// TestSuggestedAnswers, against the real router and an answerer that
// suggests (pkg/answerer.Suggest) on a route with auto_accept 0.9 and
// fallback human: a suggestion at 0.95 answers the question by itself
// (answered_by suggested:bot); one at 0.72 sends it to people, whose page
// shows it preselected with its confidence and rationale, and their
// answer resumes the thread.
func TestSuggestedAnswers(t *testing.T) {
	s := start(t, options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- answerer.Serve(ctx, s.srv.Conn(t), "bots", answerer.HandlerFunc(func(_ context.Context, q lifecycle.Question) (answerer.Reply, error) {
			if strings.Contains(q.Question, "sure") {
				return answerer.Suggest("parseConfig", 0.95, "every loader is parse*"), nil
			}
			return answerer.Suggest("parseConfig", 0.72, "most loaders are parse*"), nil
		}), answerer.WithAnsweredBy("bot"), answerer.WithLogger(quietLogger()))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("answerer: %v", err)
		}
	})
	opts := []string{"readConfig", "parseConfig"}
	sure, err := s.c.Dispatch(t.Context(), lifecycleRequest("bot-asker", sentinel{Question: "Rename the loader (sure)?", Options: opts, Kind: "decision"}))
	if err != nil {
		t.Fatal(err)
	}
	if out := s.finished(sure.ThreadID); string(out["answer"]) != `"parseConfig"` || string(out["answered_by"]) != `"suggested:bot"` {
		t.Errorf("the sure suggestion resumed the thread with %s by %s", out["answer"], out["answered_by"])
	}

	unsure, err := s.c.Dispatch(t.Context(), lifecycleRequest("bot-asker", sentinel{Question: "Rename the loader?", Options: opts, Kind: "decision"}))
	if err != nil {
		t.Fatal(err)
	}
	qid := lifecycle.QuestionID(unsure.DispatchID)
	d := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Pending() && q.Route == "human" })
	if sg := d.Question.Suggestion; sg == nil || sg.Accepted || sg.Answer != "parseConfig" || sg.Confidence != 0.72 || sg.By != "bot" {
		t.Fatalf("suggestion = %+v", sg)
	}
	b := s.browser()
	b.login("alice", password)
	mustContain(t, "the question page", b.get("/inbox/questions/"+qid).body, `id="suggestion"`, "72%", "most loaders are parse*",
		`class="option suggested" autofocus aria-describedby="suggestion" name="answer" value="parseConfig"`)
	if p := b.post("/inbox/questions/"+qid+"/answer", url.Values{"answer": {"readConfig"}}); p.status != http.StatusSeeOther {
		t.Fatalf("answer: %d %s", p.status, clipBody(p.body))
	}
	if out := s.finished(unsure.ThreadID); string(out["answer"]) != `"readConfig"` || string(out["answered_by"]) != `"alice"` {
		t.Errorf("the person's answer resumed the thread with %s by %s", out["answer"], out["answered_by"])
	}
}
