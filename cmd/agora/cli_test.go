package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/testkit"
)

func TestSubagentApplyListGet(t *testing.T) {
	t.Parallel()
	def := writeFile(t, "echoer.yaml", `name: echoer
runtime: exec
command: ["/bin/sh", "-c", "echo hello"]
timeout: 1m
description: says hello
`)
	first := mustAgora(t, "subagent", "apply", "-f", def)
	m := regexp.MustCompile(`^sub-agent echoer (?:created: first version, |(?:updated|unchanged) \()subagent_revision (\d+)\)?\n$`).FindStringSubmatch(first.stdout)
	if m == nil {
		t.Fatalf("apply: %s", first)
	}
	again := mustAgora(t, "subagent", "apply", "-f", def)
	if want := fmt.Sprintf("sub-agent echoer unchanged (subagent_revision %s)\n", m[1]); again.stdout != want {
		t.Errorf("apply again = %q, want %q", again.stdout, want)
	}

	list := mustAgora(t, "subagent", "list")
	if !regexp.MustCompile(`(?m)^echoer\s+exec\s+` + m[1] + `\s+.*says hello$`).MatchString(list.stdout) {
		t.Errorf("list has no echoer row:\n%s", list.stdout)
	}
	var names []string
	for _, l := range jsonLines(t, mustAgora(t, "subagent", "list", "--json").stdout) {
		names = append(names, l["name"].(string))
	}
	if !slices.Contains(names, "echoer") || !slices.Contains(names, "demo") {
		t.Errorf("list --json names = %v, want echoer and demo", names)
	}

	get := mustAgora(t, "subagent", "get", "echoer")
	for _, want := range []string{"# sub-agent echoer, revision " + m[1], "name: echoer\nruntime: exec\ncommand:\n  - /bin/sh\n", "timeout: 1m\n"} {
		if !strings.Contains(get.stdout, want) {
			t.Errorf("get lacks %q:\n%s", want, get.stdout)
		}
	}
	// The YAML applies back unchanged.
	back := mustAgora(t, "subagent", "apply", "-f", writeFile(t, "back.yaml", get.stdout))
	if !strings.Contains(back.stdout, "unchanged") {
		t.Errorf("get's YAML applied back: %s", back)
	}
	getJSON := jsonLines(t, mustAgora(t, "subagent", "get", "echoer", "--json").stdout)
	if len(getJSON) != 1 || getJSON[0]["name"] != "echoer" || getJSON[0]["runtime"] != "exec" {
		t.Errorf("get --json = %v", getJSON)
	}

	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"invalid fields", "name: bad one\nruntime: exec\ntimeout: soon\n", []string{"name:", "command: required", "timeout:"}},
		{"unknown field", "name: typo\nruntime: exec\ncomand: [x]\ntimout: 2m\n", []string{"line 3: comand: not a field of a definition; did you mean command?", "line 4: timout", "did you mean timeout?", "command: required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := agora(t, "subagent", "apply", "-f", writeFile(t, "bad.yaml", tc.yaml))
			if r.code == 0 || r.stdout != "" {
				t.Fatalf("a bad definition was applied: %s", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q: %s", w, r.stderr)
				}
			}
		})
	}
	if r := agora(t, "subagent", "get", "nobody"); r.code != 1 || !strings.Contains(r.stderr, "no sub-agent nobody") {
		t.Errorf("get of an unknown name: %s", r)
	}
}

var answerLineRE = regexp.MustCompile(`agora answer (q-\S+) readConfig(?: --shown sha256:[0-9a-f]{64})?$`)

// waitsOn reports whether q, a line of agora questions --json, lists the
// question qid among the questions of the threads waiting on it.
func waitsOn(q map[string]any, qid string) bool {
	wt, _ := q["waiting_threads"].([]any)
	for _, w := range wt {
		if m, _ := w.(map[string]any); m["question_id"] == qid {
			return true
		}
	}
	return false
}

// TestDispatchWaitAcrossAQuestion is the walkthrough: dispatch the demo and
// wait; it asks; another process answers; the waiting dispatch prints the
// result and exits 0.
func TestDispatchWaitAcrossAQuestion(t *testing.T) {
	t.Parallel()
	d := devServer(t)
	wait := start(t, "dispatch", "demo", "--input", `{"task":"rename the config loader"}`, "--wait")
	line := wait.waitLine(t, 30*time.Second, answerLineRE.MatchString)
	qid := answerLineRE.FindStringSubmatch(line)[1]
	out := wait.stdout.String()
	for _, want := range []string{
		"Which function should I rename to loadConfig?",
		"Options: parseConfig, readConfig",
		"Answer it in the inbox: " + d.httpURL + "/inbox/questions/" + qid,
		"agora answer " + qid + " parseConfig",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the question block lacks %q:\n%s", want, out)
		}
	}

	t.Run("inbox link", func(t *testing.T) {
		// The printed link is the question's page in the inbox `agora dev`
		// serves, read with the dev login token of its banner.
		m := regexp.MustCompile(`token=([A-Za-z0-9_-]+)`).FindStringSubmatch(d.log.String())
		if m == nil {
			t.Fatalf("agora dev printed no dev login token:\n%s", d.log.String())
		}
		// The inbox learns of the question from the stream: give it a moment.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			req, _ := http.NewRequest(http.MethodGet, d.httpURL+"/inbox/questions/"+qid, nil)
			req.Header.Set("Authorization", "Bearer "+m[1])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), "Which function should I rename") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET the printed inbox link: %s\n%s", resp.Status, body)
			}
		}
	})

	t.Run("questions", func(t *testing.T) {
		var found map[string]any
		// Waiting questions come from the router's index, which learns
		// of a question through its watch a moment after the record. The
		// demo asks every thread the same question, so another test's
		// demo may have asked it first: then qid joined that one and is
		// listed among its waiting threads (docs/router.md, "Ask once").
		testkit.Eventually(t, 10*time.Second, "questions --json to list "+qid, func() bool {
			for _, q := range jsonLines(t, mustAgora(t, "questions", "--json").stdout) {
				if q["question_id"] == qid || waitsOn(q, qid) {
					found = q
				}
			}
			return found != nil
		})
		for _, k := range []string{"question_id", "question", "options", "kind", "route", "status", "dispatch_id", "thread_id"} {
			if _, ok := found[k]; !ok {
				t.Errorf("question line lacks %q: %v", k, found)
			}
		}
		if found["status"] != "asked" || found["route"] != "human" || found["kind"] != "decision" {
			t.Errorf("question = %v", found)
		}
		if table := mustAgora(t, "questions"); !strings.Contains(table.stdout, found["question_id"].(string)) || !strings.Contains(table.stdout, "QUESTION_ID") {
			t.Errorf("questions table:\n%s", table)
		}
	})

	t.Run("questions paging", func(t *testing.T) {
		// One page of one: the waiting question, and no next page
		// unless more wait.
		r := mustAgora(t, "questions", "--limit", "1", "--json")
		if lines := jsonLines(t, r.stdout); len(lines) != 1 {
			t.Errorf("--limit 1 gave %d lines:\n%s", len(lines), r.stdout)
		}
		if all := jsonLines(t, mustAgora(t, "questions", "--all", "--limit", "1", "--json").stdout); len(all) < 1 {
			t.Error("--all listed nothing")
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"questions", "--limit", "0"}, "--limit 0"},
			{[]string{"questions", "--limit", "5000"}, "--limit 5000"},
			{[]string{"questions", "--status", "answered", "--cursor", "1.q-x"}, "--cursor and --all page waiting questions"},
			{[]string{"questions", "--cursor", "1.q-x", "--all"}, "give one"},
			{[]string{"questions", "--cursor", "bogus"}, "cursor"},
		} {
			r := agora(t, c.args...)
			if r.code != 1 || !strings.Contains(r.stderr, c.want) {
				t.Errorf("agora %s: exit %d, stderr %q; want 1 and %q", strings.Join(c.args, " "), r.code, r.stderr, c.want)
			}
		}
	})

	t.Run("invalid answer", func(t *testing.T) {
		r := agora(t, "answer", qid, "renameEverything")
		if r.code != 1 || !strings.Contains(r.stderr, "not one of the options") {
			t.Errorf("an answer outside the options: %s", r)
		}
		r = agora(t, "answer", qid, "--decision", "approve")
		if r.code != 1 || !strings.Contains(r.stderr, "only for approval questions") || !strings.Contains(r.stderr, "parseConfig, readConfig") {
			t.Errorf("--decision on a decision question: %s", r)
		}
	})

	// The printed line, run as it is.
	args := strings.Fields(line[strings.Index(line, "agora answer"):])[1:]
	if r := mustAgora(t, args...); !strings.Contains(r.stdout, "answered "+qid) {
		t.Errorf("answer: %s", r)
	}
	if code := wait.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("dispatch --wait exit %d\n%s\n%s", code, wait.stdout.String(), wait.stderr.String())
	}
	out = wait.stdout.String()
	for _, want := range []string{"Finished: demo, round 1", `"renamed": "readConfig"`, `"reused_analysis": true`} {
		if !strings.Contains(out, want) {
			t.Errorf("the result lacks %q:\n%s", want, out)
		}
	}

	t.Run("answer twice", func(t *testing.T) {
		r := agora(t, "answer", qid, "parseConfig", "--as", "bob")
		if r.code != 1 || !strings.Contains(r.stderr, "already answered by cli:local at ") {
			t.Errorf("a second answer: %s", r)
		}
	})

	thread := strings.TrimPrefix(qid, "q-") // the root dispatch id is the thread id
	t.Run("audit trail", func(t *testing.T) {
		// The decision log holds the question and its answer; the
		// thread's export and the whole log verify, a tampered copy not.
		var trail string
		testkit.Eventually(t, 20*time.Second, "the answered entry of "+qid, func() bool {
			trail = mustAgora(t, "audit", "export", "--thread", thread).stdout
			return strings.Contains(trail, `"kind":"answered"`) && strings.Contains(trail, `"question_id":"`+qid+`"`)
		})
		if r := mustAgora(t, "audit", "verify", writeFile(t, "trail.jsonl", trail)); !strings.Contains(r.stdout, "ok: filtered export (thread="+thread+")") {
			t.Errorf("verify the thread's trail: %s", r)
		}
		full := mustAgora(t, "audit", "export").stdout
		if r := mustAgora(t, "audit", "verify", writeFile(t, "log.jsonl", full)); !strings.Contains(r.stdout, "ok: complete export") {
			t.Errorf("verify the log: %s", r)
		}
		tampered := strings.Replace(full, `"answered_by":"cli:local"`, `"answered_by":"someone else"`, 1)
		if tampered == full {
			t.Fatalf("no answer by cli:local in the log:\n%s", full)
		}
		if r := agora(t, "audit", "verify", writeFile(t, "tampered.jsonl", tampered)); r.code != 1 || !strings.Contains(r.stderr, "altered") {
			t.Errorf("verify a tampered log: %s", r)
		}
	})
	t.Run("events", func(t *testing.T) {
		r := mustAgora(t, "events", "--thread", thread)
		var kinds []string
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			if f := strings.Fields(l); len(f) > 2 {
				kinds = append(kinds, f[2])
			}
		}
		want := []string{"accepted", "started", "needs_input", "accepted", "started", "finished"}
		if !slices.Equal(kinds, want) {
			t.Errorf("events --thread kinds = %v, want %v\n%s", kinds, want, r.stdout)
		}
		lines := jsonLines(t, mustAgora(t, "events", "--thread", thread, "--json").stdout)
		if len(lines) != len(want) {
			t.Fatalf("events --json: %d lines, want %d", len(lines), len(want))
		}
		for i, e := range lines {
			if e["specversion"] != "1.0" || e["type"] != "dev.agora.dispatch."+want[i] || e["data"].(map[string]any)["thread_id"] != thread {
				t.Errorf("event %d = %v", i, e)
			}
		}
		if r := mustAgora(t, "events", "--thread", thread, "--kind", "finished"); strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("events --kind finished:\n%s", r.stdout)
		}
	})

	t.Run("status", func(t *testing.T) {
		r := mustAgora(t, "status", thread, "--thread")
		if !strings.Contains(r.stdout, "thread "+thread+": finished") || !strings.Contains(r.stdout, "needs_input") ||
			!strings.Contains(r.stdout, "RESUMED WITH") || !strings.Contains(r.stdout, "by cli:local to q-") {
			t.Errorf("status --thread:\n%s", r.stdout)
		}
		th := jsonLines(t, mustAgora(t, "status", thread, "--thread", "--json").stdout)[0]
		rounds, _ := th["rounds"].([]any)
		if len(rounds) != 2 {
			t.Fatalf("status --thread --json: %v", th)
		}
		round1 := rounds[1].(map[string]any)["dispatch_id"].(string)
		if r := mustAgora(t, "status", round1); !regexp.MustCompile(`resumed\s+"(parseConfig|readConfig)" by cli:local to ` + qid).MatchString(r.stdout) {
			t.Errorf("status of the resumed round does not show its answer:\n%s", r.stdout)
		}
		// The round that asked says where its thread went, not to answer.
		r = mustAgora(t, "status", thread)
		if !regexp.MustCompile(`Its question was answered: "(parseConfig|readConfig)" by cli:local at `).MatchString(r.stdout) ||
			!strings.Contains(r.stdout, "The thread went on: round 1 is dispatch "+round1+", finished") || strings.Contains(r.stdout, "If the question is still open") {
			t.Errorf("status of the round whose question was answered:\n%s", r.stdout)
		}
	})

	// Round 0 ended needs_input, but its question was answered and round 1
	// finished: cancelling round 0 cancels nothing and says so.
	t.Run("cancel a finished thread", func(t *testing.T) {
		r := agora(t, "cancel", thread)
		if r.code != 5 || !strings.Contains(r.stdout, "had already ended") ||
			!strings.Contains(r.stdout, "which finished): nothing to cancel") || strings.Contains(r.stdout, "paused on a question") {
			t.Errorf("cancel of a finished thread's first round: %s", r)
		}
		r = agora(t, "cancel", thread, "--json")
		lines := jsonLines(t, r.stdout)
		if r.code != 5 || len(lines) != 1 || lines[0]["outcome"] != "already-ended" ||
			lines[0]["thread_status"] != "finished" || lines[0]["dispatch_id"] != thread || lines[0]["latest_round"] != float64(1) {
			t.Errorf("cancel --json of a finished thread's first round: %s", r)
		}
		if r := mustAgora(t, "status", thread, "--thread"); !strings.Contains(r.stdout, "thread "+thread+": finished") {
			t.Errorf("the thread changed after the cancel:\n%s", r.stdout)
		}
		q := jsonLines(t, mustAgora(t, "questions", "--status", "all", "--thread", thread, "--json").stdout)
		if len(q) != 1 || q[0]["status"] != "answered" {
			t.Errorf("the question after the cancel: %v", q)
		}
		// The whole thread: nothing to cancel either, on every door.
		r = agora(t, "cancel", thread, "--thread")
		if r.code != 5 || !strings.Contains(r.stdout, "had already ended") || strings.Contains(r.stdout, "cancelled thread") {
			t.Errorf("cancel --thread of a finished thread: %s", r)
		}
		r = agora(t, "cancel", thread, "--thread", "--json")
		if lines := jsonLines(t, r.stdout); r.code != 5 || len(lines) != 1 || lines[0]["outcome"] != "already-ended" {
			t.Errorf("cancel --thread --json of a finished thread: %s", r)
		}
	})
}

// TestCancelPausedThreadTwice: the first cancel of a thread paused on a
// question ends it (thread-cancelling); the second finds it already being
// cancelled and says nothing was cancelled (exit 5, already-ended), over
// the CLI and over HTTP.
func TestCancelPausedThreadTwice(t *testing.T) {
	t.Parallel()
	d := devServer(t)
	r := agora(t, "dispatch", "demo", "--input", `{"task":"x"}`, "--round", "--json")
	if r.code != 4 {
		t.Fatalf("dispatch --round of a dispatch that asks: %s", r)
	}
	id, _ := jsonLines(t, r.stdout)[0]["subject"].(string) // the dispatch id
	if id == "" {
		t.Fatalf("no dispatch id in %s", r.stdout)
	}
	first := agora(t, "cancel", id, "--json")
	if lines := jsonLines(t, first.stdout); first.code != 0 || len(lines) != 1 || lines[0]["outcome"] != "thread-cancelling" {
		t.Fatalf("first cancel: %s", first)
	}
	second := agora(t, "cancel", id)
	if second.code != 5 || !strings.Contains(second.stdout, "already being cancelled") {
		t.Errorf("second cancel: %s", second)
	}
	resp, err := http.Post(d.httpURL+"/v1/dispatches/"+id+"/cancel", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var rec map[string]any
	if err := json.Unmarshal(body, &rec); err != nil || resp.StatusCode != http.StatusOK || rec["outcome"] != "already-ended" {
		t.Errorf("POST cancel of a thread already being cancelled: %s %s", resp.Status, body)
	}
}

func TestDispatchRoundJSON(t *testing.T) {
	t.Parallel()
	r := agora(t, "dispatch", "demo", "--input", `{"task":"x"}`, "--round", "--json")
	if r.code != 4 {
		t.Fatalf("dispatch --round of a dispatch that asks: %s", r)
	}
	lines := jsonLines(t, r.stdout)
	var types []string
	for _, e := range lines {
		typ, _ := e["type"].(string)
		if e["specversion"] != "1.0" || !strings.HasPrefix(typ, "dev.agora.dispatch.") || e["id"] == "" || e["source"] == "" {
			t.Errorf("not an Agora CloudEvent: %v", e)
		}
		types = append(types, strings.TrimPrefix(typ, "dev.agora.dispatch."))
	}
	if want := []string{"accepted", "started", "needs_input"}; !slices.Equal(types, want) {
		t.Errorf("events = %v, want %v", types, want)
	}
	data := lines[len(lines)-1]["data"].(map[string]any)
	if data["question_id"] == "" || len(data["options"].([]any)) != 2 {
		t.Errorf("needs_input data = %v", data)
	}
}

func TestDispatchRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown sub-agent", []string{"dispatch", "nobody-registered", "--wait"}, []string{"subagent:", `"nobody-registered"`, "agora subagent apply"}},
		{"input not an object", []string{"dispatch", "demo", "--input", "[1]"}, []string{"--input must be a JSON object"}},
		{"bad label", []string{"dispatch", "demo", "--label", "novalue"}, []string{"--label", "KEY=VALUE"}},
		{"wait and round", []string{"dispatch", "demo", "--wait", "--round"}, []string{"wait", "round"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := agora(t, tc.args...)
			if r.code != 1 || r.stdout != "" {
				t.Fatalf("%s", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q: %s", w, r.stderr)
				}
			}
		})
	}
}

// applyShell registers an exec sub-agent name that runs script with
// /bin/sh -c.
func applyShell(t *testing.T, name, script string) {
	t.Helper()
	def, err := json.Marshal(map[string]any{"name": name, "runtime": "exec", "command": []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	mustAgora(t, "subagent", "apply", "-f", writeFile(t, name+".json", string(def)))
}

func TestDispatchFailed(t *testing.T) {
	t.Parallel()
	applyShell(t, "failer", "echo boom >&2; exit 3")
	r := agora(t, "dispatch", "failer", "--wait")
	if r.code != 2 || !strings.Contains(r.stdout, "Failed (provider-failed)") || !strings.Contains(r.stdout, "boom") {
		t.Errorf("dispatch --wait of a failing sub-agent: %s", r)
	}
}

func TestCancelRunning(t *testing.T) {
	t.Parallel()
	applyShell(t, "sleeper", "sleep 60")
	rec := jsonLines(t, mustAgora(t, "dispatch", "sleeper", "--json").stdout)
	id := rec[0]["dispatch_id"].(string)
	status := func() string {
		t.Helper()
		return jsonLines(t, mustAgora(t, "status", id, "--json").stdout)[0]["status"].(string)
	}
	testkit.Eventually(t, 20*time.Second, "dispatch "+id+" to start", func() bool { return status() == "started" })
	if r := mustAgora(t, "cancel", id); !strings.Contains(r.stdout, "cancelled dispatch "+id) {
		t.Errorf("cancel: %s", r)
	}
	if s := status(); s != "cancelled" {
		t.Errorf("status after cancel = %s", s)
	}
	if r := mustAgora(t, "status", id); !strings.Contains(r.stdout, "cancelled by cli:local") {
		t.Errorf("status:\n%s", r.stdout)
	}
	// The same id again is the same dispatch, which ended cancelled.
	if r := agora(t, "dispatch", "sleeper", "--id", id, "--round"); r.code != 3 || !strings.Contains(r.stdout, "Cancelled by cli:local") {
		t.Errorf("dispatch --round of a cancelled dispatch: %s", r)
	}
	if r := agora(t, "cancel", "no-such-dispatch"); r.code != 1 || !strings.Contains(r.stderr, "no dispatch no-such-dispatch") {
		t.Errorf("cancel of an unknown id: %s", r)
	}
}

func TestAnswerUnknownQuestion(t *testing.T) {
	t.Parallel()
	r := agora(t, "answer", "q-no-such-dispatch", "yes")
	if r.code != 1 || !strings.Contains(r.stderr, "no question q-no-such-dispatch") {
		t.Errorf("answer to an unknown question: %s", r)
	}
	r = agora(t, "answer", "q-no-such-dispatch", "yes", "--json")
	if r.code != 1 || len(jsonLines(t, r.stdout)) != 1 || jsonLines(t, r.stdout)[0]["status"] != "not_found" {
		t.Errorf("answer --json to an unknown question: %s", r)
	}
}

func TestConnectionErrors(t *testing.T) {
	t.Parallel()
	nothing := fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	env := append(cleanEnv(), "AGORA_NATS_URL="+nothing)
	for _, args := range [][]string{{"status", "x"}, {"dispatch", "demo", "--wait"}, {"events"}, {"subagent", "list"}} {
		r := agoraWith(t, env, args...)
		want := "cannot reach NATS at " + nothing + " — is `agora dev` running?"
		if r.code != 1 || !strings.Contains(r.stderr, want) {
			t.Errorf("agora %v with nothing listening: %s", args, r)
		}
	}

	// A NATS server with no Agora on it.
	srv := natstest.Start(t)
	env = append(cleanEnv(), "AGORA_NATS_URL="+srv.URL)
	if r := agoraWith(t, env, "dispatch", "demo"); r.code != 1 || !strings.Contains(r.stderr, "no dispatcher is answering agora.api.dispatch — is `agora dev` running?") {
		t.Errorf("dispatch with no dispatcher: %s", r)
	}
	if r := agoraWith(t, env, "answer", "q-x", "yes"); r.code != 1 || !strings.Contains(r.stderr, "no router is answering agora.api.answer") {
		t.Errorf("answer with no router: %s", r)
	}
	if r := agoraWith(t, env, "events"); r.code != 1 || !strings.Contains(r.stderr, "`agora dev` provisions them") {
		t.Errorf("events with no streams: %s", r)
	}
}

// A NATS user that may subscribe only to replies of its own prefix (as
// every user of the deploy) gets a request's timeout explained: the
// refused subscription and the setting that fixes it; a publish the user
// is not granted is named too.
func TestPermissionViolationsExplained(t *testing.T) {
	t.Parallel()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, Users: []*server.User{{
		Username: "client", Password: "pw",
		Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"agora.api.status"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_client.>"}},
		},
	}}}
	s := natstest.StartOptions(t, opts)
	url := fmt.Sprintf("nats://client:pw@%s", s.Addr())
	env := append(cleanEnv(), "AGORA_NATS_URL="+url)
	r := agoraWith(t, env, "status", "d-1", "--request-timeout", "2s")
	if r.code != 1 || !strings.Contains(r.stderr, "refused this user's subscription to its replies") || !strings.Contains(r.stderr, "AGORA_NATS_INBOX_PREFIX=_INBOX_client") {
		t.Errorf("status without the reply prefix: %s", r)
	}
	if strings.Contains(r.stderr, ":pw@") {
		t.Errorf("the message shows the URL's password: %s", r)
	}
	env = append(env, "AGORA_NATS_INBOX_PREFIX=_INBOX_client")
	if r := agoraWith(t, env, "status", "d-1", "--request-timeout", "2s"); r.code != 1 || !strings.Contains(r.stderr, "no dispatcher is answering agora.api.status") {
		t.Errorf("status with the reply prefix and no dispatcher: %s", r)
	}
	if r := agoraWith(t, env, "cancel", "d-1", "--request-timeout", "2s"); r.code != 1 || !strings.Contains(r.stderr, `refused the request (Permissions Violation for Publish to "agora.api.cancel")`) {
		t.Errorf("cancel, not granted: %s", r)
	}
}

func TestJSONOnlyOnStdout(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"subagent", "list", "--json"},
		{"questions", "--status", "all", "--json"},
		{"events", "--kind", "accepted", "--json"},
	} {
		r := mustAgora(t, args...)
		for _, l := range jsonLines(t, r.stdout) {
			if _, err := json.Marshal(l); err != nil {
				t.Error(err)
			}
		}
	}
}

// An approval question: questions marks it as one with the --decision
// hint, dispatch --round prints the approve/reject lines, and answering
// with a decision resumes the thread.
func TestApprovalQuestion(t *testing.T) {
	t.Parallel()
	applyShell(t, "approver", `if grep -q decision "$AGORA_INPUT_FILE"; then echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"; else echo '{"question":"Ship it?","kind":"approval"}' > "$AGORA_NEEDS_INPUT_FILE"; fi`)
	r := agora(t, "dispatch", "approver", "--round")
	if r.code != 4 || !strings.Contains(r.stdout, "--decision approve") {
		t.Fatalf("dispatch --round of an asking sub-agent: %s", r)
	}
	m := regexp.MustCompile(`agora answer (q-\S+) approve --decision approve`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no approve line: %s", r)
	}
	qid := m[1]
	var table string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		q := mustAgora(t, "questions")
		if table = q.stdout; strings.Contains(table, qid) {
			if !strings.Contains(q.stderr, "--decision approve|reject") {
				t.Errorf("questions hint lacks --decision: %s", q.stderr)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("questions does not list %s:\n%s", qid, table)
		}
	}
	for _, l := range strings.Split(table, "\n") {
		if strings.Contains(l, qid) && (!strings.Contains(l, "approval: --decision approve|reject") || strings.Contains(l, "(free text)")) {
			t.Errorf("questions row of an approval: %q", l)
		}
	}
	if r := agora(t, "answer", qid, "yes"); r.code != 1 || !strings.Contains(r.stderr, "needs a decision") {
		t.Errorf("an approval answered without a decision: %s", r)
	}
	if r := mustAgora(t, "answer", qid, "--decision", "approve", "--comment", "fine"); !strings.Contains(r.stdout, "answered "+qid+": approve") {
		t.Errorf("answer --decision approve: %s", r)
	}
	thread := strings.TrimPrefix(qid, "q-")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		th := jsonLines(t, mustAgora(t, "status", thread, "--thread", "--json").stdout)[0]
		if th["status"] == "finished" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the thread did not finish after the approval: %v", th)
		}
	}
	if r := mustAgora(t, "status", thread, "--thread"); !strings.Contains(r.stdout, `"approve" by cli:local, comment "fine" to `+qid) {
		t.Errorf("status --thread after the approval:\n%s", r.stdout)
	}
}

// agora dev's /healthz reports every service it runs.
func TestDevHealthzReportsEveryService(t *testing.T) {
	t.Parallel()
	code, body := devServer(t).healthz(t)
	var h struct {
		Status   string                    `json:"status"`
		Services map[string]map[string]any `json:"services"`
	}
	if err := json.Unmarshal(body, &h); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK || h.Status != "ok" {
		t.Errorf("/healthz = %d %+v", code, h)
	}
	for _, name := range []string{"dispatcher", "worker", "router", "inbox"} {
		if h.Services[name]["status"] != "ok" {
			t.Errorf("/healthz services[%s] = %v", name, h.Services[name])
		}
	}
	if _, ok := h.Services["worker"]["sandbox"]; !ok {
		t.Errorf("the worker's health lacks its sandbox report: %v", h.Services["worker"])
	}
}

// agora dev serves the A2A agent card on its listener, the demo among
// its skills, and /a2a beside it.
func TestDevServesA2A(t *testing.T) {
	t.Parallel()
	d := devServer(t)
	resp, err := http.Get(d.httpURL + "/.well-known/agent-card.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var card struct {
		Skills     []struct{ ID string }  `json:"skills"`
		Interfaces []struct{ URL string } `json:"supportedInterfaces"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&card); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("agent card: %s %v", resp.Status, err)
	}
	if !slices.ContainsFunc(card.Skills, func(s struct{ ID string }) bool { return s.ID == "demo" }) ||
		len(card.Interfaces) == 0 || card.Interfaces[0].URL != d.httpURL+"/a2a" {
		t.Errorf("agent card %+v, want the demo skill at %s/a2a", card, d.httpURL)
	}
}

// A missing argument is named in words, with an example; the global
// request timeout and dispatch's sub-agent time limit have their own names.
func TestMissingArgumentsAndFlagNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"dispatch"}, []string{"missing SUBAGENT", "e.g. `agora dispatch demo"}},
		{[]string{"answer"}, []string{"missing QUESTION_ID", "e.g. `agora answer q-"}},
		{[]string{"cancel"}, []string{"missing ID", "e.g. `agora cancel "}},
		{[]string{"status"}, []string{"missing ID", "--thread"}},
		{[]string{"subagent", "get"}, []string{"missing NAME", "agora subagent get demo"}},
		{[]string{"status", "a", "b"}, []string{`"b" is one too many`}},
	} {
		r := agora(t, c.args...)
		for _, w := range c.want {
			if r.code != 1 || !strings.Contains(r.stderr, w) {
				t.Errorf("agora %v: stderr lacks %q: %s", c.args, w, r)
			}
		}
	}
	help := mustAgora(t, "answer", "--help").stdout
	asLine := regexp.MustCompile(`(?m)^\s+--as .*$`).FindString(help)
	// --as names nobody by default: the credentials do ($USER proves nothing).
	if strings.Contains(asLine, "default") || !strings.Contains(asLine, "cli:<credentials>") || !strings.Contains(help, "--request-timeout") {
		t.Errorf("answer --help:\n%s", help)
	}
	// The old global name still works, and says what replaced it.
	if r := agora(t, "status", "no-such-dispatch", "--timeout", "5s"); r.code != 1 || !strings.Contains(r.stderr, "--request-timeout") {
		t.Errorf("status --timeout: %s", r)
	}
}

// Reusing --id with a different request is refused, naming what differs;
// the same request again is the same dispatch.
func TestDispatchIDReusedForADifferentRequest(t *testing.T) {
	t.Parallel()
	first := jsonLines(t, mustAgora(t, "dispatch", "demo", "--id", "reuse-1", "--input", `{"task":"a"}`, "--json").stdout)
	again := jsonLines(t, mustAgora(t, "dispatch", "demo", "--id", "reuse-1", "--input", `{"task": "a"}`, "--json").stdout)
	if first[0]["dispatch_id"] != "reuse-1" || again[0]["created_at"] != first[0]["created_at"] {
		t.Errorf("replay: %v then %v", first, again)
	}
	r := agora(t, "dispatch", "demo", "--id", "reuse-1", "--input", `{"task":"b"}`)
	if r.code != 1 || !strings.Contains(r.stderr, "input") || !strings.Contains(r.stderr, "reuse-1") {
		t.Errorf("a different request under a used id: %s", r)
	}
}

// A dispatch that is not recorded — never was, or finished and expired
// after the retention — is exit code 1, naming the retention.
func TestStatusOfExpiredWork(t *testing.T) {
	t.Parallel()
	r := agora(t, "status", "01M80000000000000000000000")
	if r.code != 1 || !strings.Contains(r.stderr, "AGORA_RETENTION") || !strings.Contains(r.stderr, "168h0m0s") {
		t.Errorf("status of an unknown dispatch: %s", r)
	}
	r = agora(t, "status", "--thread", "01M80000000000000000000000")
	if r.code != 1 || !strings.Contains(r.stderr, "kept for 168h0m0s") {
		t.Errorf("status of an unknown thread: %s", r)
	}
}
