package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// putQuestions writes question records into the dev server's
// agora_questions bucket, as the router keeps them, for the verbs that read
// the bucket.
func putQuestions(t *testing.T, qs ...lifecycle.Question) {
	t.Helper()
	natstest.PutQuestions(t, devServer(t).jetStream(t), qs...)
}

// askedOnce is a question three threads wait on, with a suggestion below
// the route's auto_accept, one question that joined it, one answered from
// a remembered decision and one a suggestion answered; all of one thread
// set (ids of this test's own) so other tests' questions stay out.
func askedOnce(t *testing.T) (asked, joined, reused, suggested lifecycle.Question) {
	t.Helper()
	at := time.Now().Add(-5 * time.Minute).UTC().Truncate(time.Second)
	common := func() lifecycle.Common {
		id := lifecycle.NewID()
		return lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "renamer", Round: 0}
	}
	ca, cj, c3 := common(), common(), common()
	asked = lifecycle.Question{Common: ca, QuestionID: lifecycle.QuestionID(ca.DispatchID), Event: "asked", Status: "asked",
		Route: "default", Question: "Rename the config loader to readConfig or parseConfig?", Options: []string{"readConfig", "parseConfig"},
		Kind: "decision", AskedAt: at,
		WaitingThreads: []lifecycle.WaitingThread{
			{QuestionID: lifecycle.QuestionID(ca.DispatchID), DispatchID: ca.DispatchID, ThreadID: ca.ThreadID, Subagent: "renamer", AskedAt: at},
			{QuestionID: lifecycle.QuestionID(cj.DispatchID), DispatchID: cj.DispatchID, ThreadID: cj.ThreadID, Subagent: "renamer", AskedAt: at.Add(time.Second)},
			{QuestionID: lifecycle.QuestionID(c3.DispatchID), DispatchID: c3.DispatchID, ThreadID: c3.ThreadID, Subagent: "renamer", AskedAt: at.Add(2 * time.Second)},
		},
		Suggestion: &lifecycle.Suggestion{Answer: "parseConfig", Confidence: 0.72, Rationale: "it parses, it does not only read", By: "agent:reviewer", At: at.Add(time.Minute)},
	}
	joined = asked
	joined.Common, joined.QuestionID, joined.Status, joined.JoinedTo = cj, lifecycle.QuestionID(cj.DispatchID), lifecycle.StatusJoined, asked.QuestionID
	joined.WaitingThreads, joined.Suggestion = nil, nil

	cr, cs := common(), common()
	answeredAt := at.Add(2 * time.Minute)
	decidedAt := at.Add(-24 * time.Hour)
	reused = lifecycle.Question{Common: cr, QuestionID: lifecycle.QuestionID(cr.DispatchID), Event: "answered", Status: "answered",
		Route: "default", Question: "Keep the old flag?", Options: []string{"yes", "no"}, Kind: "decision", AskedAt: at,
		Answer: "no", AnsweredBy: "memory:q-01REMEMBERED", AnsweredAt: &answeredAt,
		Reused: &lifecycle.Reused{QuestionID: "q-01REMEMBERED", AnsweredBy: "alice", AnsweredAt: decidedAt}}
	suggested = lifecycle.Question{Common: cs, QuestionID: lifecycle.QuestionID(cs.DispatchID), Event: "answered", Status: "answered",
		Route: "default", Question: "Which test runner?", Options: []string{"go test", "gotestsum"}, Kind: "decision", AskedAt: at,
		Answer: "go test", AnsweredBy: "suggested:agent:reviewer", AnsweredAt: &answeredAt,
		Suggestion: &lifecycle.Suggestion{Answer: "go test", Confidence: 0.95, Rationale: "the Makefile uses it", By: "agent:reviewer", At: answeredAt, Accepted: true}}
	putQuestions(t, asked, joined, reused, suggested)
	return asked, joined, reused, suggested
}

// agora questions shows a question asked once for several threads, the
// one that joined it, a pending suggestion and whose remembered decision
// or suggestion answered a question: in the table, in --long, in
// questions show, and field for field in --json.
func TestQuestionsShowAskOnce(t *testing.T) {
	t.Parallel()
	asked, joined, reused, suggested := askedOnce(t)

	r := mustAgora(t, "questions", "--status", "all", "--thread", asked.ThreadID)
	for _, want := range []string{"asked by 3 threads", "suggested: parseConfig (0.72, by agent:reviewer): it parses"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("questions: no %q in\n%s", want, r.stdout)
		}
	}
	r = mustAgora(t, "questions", "--status", "joined", "--thread", joined.ThreadID)
	if !strings.Contains(r.stdout, "joined "+asked.QuestionID) || !strings.Contains(r.stdout, "answered with "+asked.QuestionID) {
		t.Errorf("questions --status joined:\n%s", r)
	}
	r = mustAgora(t, "questions", "--status", "answered", "--thread", reused.ThreadID)
	if !strings.Contains(r.stdout, "reused the decision of q-01REMEMBERED by alice") {
		t.Errorf("a reused answer:\n%s", r)
	}
	r = mustAgora(t, "questions", "--status", "answered", "--thread", suggested.ThreadID)
	if !strings.Contains(r.stdout, "by suggested:agent:reviewer, confidence 0.95") {
		t.Errorf("an accepted suggestion:\n%s", r)
	}

	// The long form and show list the threads waiting.
	long := mustAgora(t, "questions", "--status", "all", "--thread", asked.ThreadID, "--long").stdout
	show := mustAgora(t, "questions", "show", asked.QuestionID).stdout
	for name, out := range map[string]string{"--long": long, "show": show} {
		for _, want := range []string{"asked by 3 threads", "3 waiting", "THREAD", "— shown preselected",
			asked.WaitingThreads[1].ThreadID, asked.WaitingThreads[2].DispatchID, asked.WaitingThreads[2].QuestionID} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %q in\n%s", name, want, out)
			}
		}
	}
	if out := mustAgora(t, "questions", "show", joined.QuestionID).stdout; !strings.Contains(out, "waits on") || !strings.Contains(out, asked.QuestionID) {
		t.Errorf("show of a joined question:\n%s", out)
	}
	if out := mustAgora(t, "questions", "show", reused.QuestionID).stdout; !strings.Contains(out, "reused the decision of q-01REMEMBERED by alice, made ") {
		t.Errorf("show of a reused answer:\n%s", out)
	}
	if out := mustAgora(t, "questions", "show", suggested.QuestionID).stdout; !strings.Contains(out, "accepted as the answer") {
		t.Errorf("show of an accepted suggestion:\n%s", out)
	}

	// --json passes the fields through.
	for _, args := range [][]string{{"questions", "--status", "all", "--thread", asked.ThreadID, "--json"}, {"questions", "show", asked.QuestionID, "--json"}} {
		lines := jsonLines(t, mustAgora(t, args...).stdout)
		if len(lines) != 1 {
			t.Fatalf("%v: %d lines", args, len(lines))
		}
		b, _ := json.Marshal(lines[0])
		var got lifecycle.Question
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.WaitingThreads) != 3 || got.WaitingThreads[1] != asked.WaitingThreads[1] || got.Suggestion == nil || *got.Suggestion != *asked.Suggestion {
			t.Errorf("%v: %s", args, b)
		}
	}
	lines := jsonLines(t, mustAgora(t, "questions", "show", reused.QuestionID, "--json").stdout)
	if rr, _ := lines[0]["reused"].(map[string]any); rr["question_id"] != "q-01REMEMBERED" || rr["answered_by"] != "alice" {
		t.Errorf("show --json of a reused answer: %v", lines[0])
	}
	lines = jsonLines(t, mustAgora(t, "questions", "show", joined.QuestionID, "--json").stdout)
	if lines[0]["joined_to"] != asked.QuestionID || lines[0]["status"] != "joined" {
		t.Errorf("show --json of a joined question: %v", lines[0])
	}

	// An unknown id says how to list them.
	if r := agora(t, "questions", "show", "q-01NOSUCHQUESTION"); r.code != 1 || !strings.Contains(r.stderr, "no question q-01NOSUCHQUESTION") || !strings.Contains(r.stderr, "questions --status all") {
		t.Errorf("show of an unknown question: %s", r)
	}
}

// devWithRoutes starts an agora dev of its own with the routing file
// routes and returns the environment of client commands against it; it
// stops when the test ends.
func devWithRoutes(t *testing.T, routes string) []string {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(file, []byte(routes), 0o600); err != nil {
		t.Fatal(err)
	}
	natsAddr, httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(agoraBin, "dev", "--memory", "--http", httpAddr, "--nats-listen", natsAddr, "--workers", "4", "--router-config", file)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "TMPDIR="+dir, "AGORA_LOG_LEVEL=warn")
	var log testkit.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	testkit.Eventually(t, 60*time.Second, "agora dev's /healthz", func() bool {
		select {
		case <-exited:
			t.Fatalf("agora dev exited: %s", log.String())
		default:
		}
		resp, err := http.Get("http://" + httpAddr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return append(cleanEnv(), "AGORA_NATS_URL=nats://"+natsAddr, "USER=tester")
}

// renamer asks which name the config loader gets, with a dedupe key, and
// resumed copies its input (the answer among it) to its output.
const renamer = `if grep -q '"answer"' "$AGORA_INPUT_FILE"; then cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"; else exec "$0" needs-input --question "Rename the config loader to readConfig or parseConfig?" --option readConfig --option parseConfig --kind decision --dedupe-key config-loader-name; fi`

// Ask once, end to end through the CLI against agora dev: three threads
// asking the same question wait on one, shown as asked by 3 threads; a
// fourth is told its question joined, and a thread whose question joined
// says which it waits on; one answer finishes all four; the route
// remembers it, agora decisions lists it, a fifth thread is answered from
// it with its provenance, and once forgotten the question is asked again.
func TestAskOnceEndToEnd(t *testing.T) {
	t.Parallel()
	env := devWithRoutes(t, "routes:\n  - name: default\n    answerer: human\n    remember: 720h\n")
	run := func(args ...string) result { t.Helper(); return agoraWith(t, env, args...) }
	must := func(args ...string) result {
		t.Helper()
		r := run(args...)
		if r.code != 0 {
			t.Fatalf("agora %s: %s", strings.Join(args, " "), r)
		}
		return r
	}
	def, _ := json.Marshal(map[string]any{"name": "renamer", "runtime": "exec", "command": []string{"/bin/sh", "-c", renamer, agoraBin}})
	must("subagent", "apply", "-f", writeFile(t, "renamer.json", string(def)))
	// Another sub-agent asking the same decision in other words, with the
	// same key (never answered with the renamer's decision); and one that
	// wants a fresh answer.
	other := strings.Replace(renamer, "Rename the config loader to readConfig or parseConfig?", "What should loadConfig be called?", 1)
	def, _ = json.Marshal(map[string]any{"name": "namer", "runtime": "exec", "command": []string{"/bin/sh", "-c", other, agoraBin}})
	must("subagent", "apply", "-f", writeFile(t, "namer.json", string(def)))
	def, _ = json.Marshal(map[string]any{"name": "namer-fresh", "runtime": "exec", "command": []string{"/bin/sh", "-c", strings.Replace(other, "config-loader-name;", "config-loader-name --no-reuse;", 1), agoraBin}})
	must("subagent", "apply", "-f", writeFile(t, "namer-fresh.json", string(def)))

	// Three threads ask.
	var threads []string
	for range 3 {
		r := run("dispatch", "renamer", "--round", "--json")
		if r.code != 4 {
			t.Fatalf("dispatch: %s", r)
		}
		lines := jsonLines(t, r.stdout)
		threads = append(threads, lines[len(lines)-1]["data"].(map[string]any)["thread_id"].(string))
	}
	asked := "q-" + threads[0]
	testkit.Eventually(t, 30*time.Second, "one question for three threads", func() bool {
		lines := jsonLines(t, must("questions", "--json").stdout)
		wt, _ := func() ([]any, bool) {
			if len(lines) != 1 {
				return nil, false
			}
			w, ok := lines[0]["waiting_threads"].([]any)
			return w, ok
		}()
		return len(lines) == 1 && lines[0]["question_id"] == asked && len(wt) == 3
	})
	if out := must("questions").stdout; !strings.Contains(out, "asked by 3 threads") {
		t.Errorf("questions:\n%s", out)
	}
	show := must("questions", "show", asked).stdout
	for _, th := range threads {
		if !strings.Contains(show, th) {
			t.Errorf("questions show lacks thread %s:\n%s", th, show)
		}
	}
	// A fourth thread asking is told its question joined the first's.
	r := run("dispatch", "renamer", "--round")
	m := regexp.MustCompile(`round 0, dispatch (\S+)\)`).FindStringSubmatch(r.stdout)
	if r.code != 4 || m == nil || !strings.Contains(r.stdout, "Asked once: this question joined "+asked+", the same question, which 4 threads wait on") {
		t.Fatalf("dispatch --round of a question that joins: %s", r)
	}
	threads = append(threads, m[1])
	// The second thread waits on the first's question.
	if out := must("status", threads[1]).stdout; !strings.Contains(out, "waits on") || !strings.Contains(out, asked) || !strings.Contains(out, "answer "+asked) {
		t.Errorf("status of a thread whose question joined:\n%s", out)
	}
	if out := must("status", threads[2], "--thread").stdout; !strings.Contains(out, "waits on  "+asked) {
		t.Errorf("status --thread of a thread whose question joined:\n%s", out)
	}
	if out := must("status", threads[0], "--thread").stdout; !strings.Contains(out, "asked by  4 threads") {
		t.Errorf("status --thread of the asking thread:\n%s", out)
	}

	// One answer finishes all four.
	must("answer", asked, "parseConfig")
	for _, th := range threads {
		testkit.Eventually(t, 30*time.Second, "thread "+th+" finished", func() bool {
			return jsonLines(t, must("status", th, "--thread", "--json").stdout)[0]["status"] == "finished"
		})
	}

	// The route remembered the answer.
	var d map[string]any
	testkit.Eventually(t, 10*time.Second, "the decision listed", func() bool {
		lines := jsonLines(t, must("decisions", "list", "--json").stdout)
		if len(lines) == 1 {
			d = lines[0]
		}
		return len(lines) == 1
	})
	if d["question_id"] != asked || d["answer"] != "parseConfig" || d["route"] != "default" || d["answered_by"] != "cli:local" {
		t.Errorf("decision = %v", d)
	}
	id := d["id"].(string)
	if r := must("decisions", "list", "--route", "default"); !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "parseConfig") || !strings.Contains(r.stderr, "decisions forget ID") {
		t.Errorf("decisions list:\n%s", r)
	}
	if r := must("decisions", "list", "--route", "other"); r.stdout != "" || !strings.Contains(r.stderr, "route other remembers") {
		t.Errorf("decisions list of another route:\n%s", r)
	}

	// A fifth thread is answered from memory, at once.
	r = must("dispatch", "renamer", "--wait")
	m = regexp.MustCompile(`round 0, dispatch (\S+)\)`).FindStringSubmatch(r.stdout)
	if m == nil || !strings.Contains(r.stdout, `Answered at once from memory: "parseConfig" — reused the decision of `+asked+" by cli:local") ||
		strings.Contains(r.stdout, "Answer it in the inbox") || !strings.Contains(r.stdout, `"answered_by": "memory:`+asked+`"`) {
		t.Errorf("dispatch --wait answered from memory:\n%s", r)
	}
	if m == nil {
		t.FailNow()
	}
	fourth := m[1]
	q := jsonLines(t, must("questions", "--status", "answered", "--thread", fourth, "--json").stdout)
	if len(q) != 1 || q[0]["answered_by"] != "memory:"+asked || q[0]["reused"].(map[string]any)["question_id"] != asked {
		t.Errorf("the fourth thread's question: %v", q)
	}
	if out := must("questions", "--status", "answered", "--thread", fourth).stdout; !strings.Contains(out, "reused the decision of "+asked+" by cli:local") {
		t.Errorf("questions of the fourth thread:\n%s", out)
	}

	// Another sub-agent with the same key, in other words, is asked: a
	// dedupe_key is its own sub-agent's, and memory answers only what was
	// shown (docs/security.md, "What sub-agents share"); --no-reuse asks.
	if r := run("dispatch", "namer", "--round"); r.code != 4 || strings.Contains(r.stdout, "from memory") || strings.Contains(r.stdout, "Asked once") {
		t.Errorf("namer, another sub-agent with the same dedupe key: %s", r)
	}
	if r := run("dispatch", "namer-fresh", "--round"); r.code != 4 || strings.Contains(r.stdout, "from memory") {
		t.Errorf("namer-fresh, --no-reuse: %s", r)
	}

	// Forgotten, the question is asked again.
	if r := must("decisions", "forget", id); !strings.Contains(r.stdout, "forgot "+id) || !strings.Contains(r.stdout, "asked again") {
		t.Errorf("forget: %s", r)
	}
	if r := run("decisions", "forget", id); r.code != 1 || !strings.Contains(r.stderr, "no remembered decision "+id) || !strings.Contains(r.stderr, "decisions list") {
		t.Errorf("forget again: %s", r)
	}
	if r := run("decisions", "forget", "not.an id"); r.code != 1 || !strings.Contains(r.stderr, "is not a decision id") {
		t.Errorf("forget of a bad id: %s", r)
	}
	if r := must("decisions", "list"); r.stdout != "" || !strings.Contains(r.stderr, "no route remembers") {
		t.Errorf("decisions list after forgetting: %s", r)
	}
	if r := run("dispatch", "renamer", "--round"); r.code != 4 {
		t.Errorf("after forgetting, the question is asked again: %s", r)
	}
}
