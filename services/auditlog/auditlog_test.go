package auditlog_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/auditlog"
	"github.com/agora-dispatch/agora/services/router"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startWriter runs an audit writer on a connection of its own until stop
// is called or the test ends.
func startWriter(t *testing.T, srv *natstest.Server, cfg auditlog.Config) (stop func()) {
	t.Helper()
	w, err := auditlog.New(cfg, auditlog.Deps{Conn: srv.Conn(t), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(ctx); err != nil {
			t.Errorf("audit writer: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	testkit.WaitReady(t, 10*time.Second, "audit writer", w.Ready())
	return stop
}

func entries(t *testing.T, js jetstream.JetStream) []audit.Entry {
	t.Helper()
	var out []audit.Entry
	for _, m := range natstest.Stored(t, js, audit.Stream, audit.Subject) {
		e, err := audit.Parse(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

func waitEntry(t *testing.T, js jetstream.JetStream, what string, ok func(audit.Entry) bool) audit.Entry {
	t.Helper()
	var found audit.Entry
	testkit.Eventually(t, 20*time.Second, what, func() bool {
		for _, e := range entries(t, js) {
			if ok(e) {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

func keys(t *testing.T) (privFile, pubFile string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	privPEM, pubPEM, err := audit.EncodeKeys(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	privFile, pubFile = filepath.Join(dir, "audit.key"), filepath.Join(dir, "audit.pub")
	if err := os.WriteFile(privFile, privPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubFile, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return privFile, pubFile
}

func publish(t *testing.T, js jetstream.JetStream, d lifecycle.Data) {
	t.Helper()
	_, m, err := lifecycle.Message(lifecycle.Source("test", "harness"), d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
}

func export(t *testing.T, js jetstream.JetStream, f auditlog.Filter) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := auditlog.Export(t.Context(), js, f, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// verifyPy runs examples/audit/verify.py on an export, returning its
// output and whether it accepted the export.
func verifyPy(t *testing.T, exp []byte) (string, bool) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "examples", "audit", "verify.py")
	f := filepath.Join(t.TempDir(), "export.jsonl")
	if err := os.WriteFile(f, exp, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), py, script, f).CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return string(out), err == nil
}

// A question asked through the router and answered, and a cancel, make a
// log that Agora's verifier and the Python script both accept; a tampered
// copy neither accepts.
func TestDecisionLogOfARealRun(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	rt, err := router.New(router.Config{RecordWait: time.Millisecond, Tick: 50 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: srv.Conn(t), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "router", rt.Run)
	testkit.WaitReady(t, 20*time.Second, "router", rt.Ready())
	privFile, pubFile := keys(t)
	startWriter(t, srv, auditlog.Config{CheckpointEvery: 2, SigningKeyFile: privFile})

	id := lifecycle.NewID()
	qid := lifecycle.QuestionID(id)
	publish(t, js, &lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "coder"},
		QuestionID: qid, Question: "Change function A or B?", Options: []string{"A", "B"}, Kind: "decision",
		Context: "both callers use <A> & B", PartialState: json.RawMessage(`{"step":3,"secret":"never logged"}`)})
	asked := waitEntry(t, js, "the asked entry", func(e audit.Entry) bool { return e.Kind == audit.KindAsked && e.QuestionID == qid })
	if asked.Route != "human" || asked.ThreadID != id || asked.Subagent != "coder" || !strings.HasPrefix(asked.ShownDigest, "sha256:") ||
		asked.PartialStateDigest != audit.Digest([]byte(`{"step":3,"secret":"never logged"}`)) {
		t.Fatalf("asked entry = %+v", asked)
	}
	want := audit.ShownDigest("Change function A or B?", "both callers use <A> & B", "decision", []string{"A", "B"}, asked.PartialStateDigest)
	if asked.ShownDigest != want {
		t.Errorf("shown digest %s, want %s", asked.ShownDigest, want)
	}

	c := srv.Client(t)
	comment := "B keeps <the> API & \u2028 ünï \"stable\""
	// Bound to the asked entry's shown digest: the router takes it only
	// if its own digest of the question is the log's.
	if _, err := c.Answer(t.Context(), qid, lifecycle.Answer{Answer: "B", AnsweredBy: "dana", Comment: comment, ShownDigest: asked.ShownDigest, Door: lifecycle.DoorInbox}); err != nil {
		t.Fatal(err)
	}
	ans := waitEntry(t, js, "the answered entry", func(e audit.Entry) bool { return e.Kind == audit.KindAnswered && e.QuestionID == qid })
	if ans.AnsweredBy != "dana" || ans.Answer != "B" || ans.Comment != comment || ans.NextDispatchID == "" || ans.Outcome != "redispatched" ||
		ans.Door != "inbox: api agora.api.answer" {
		t.Fatalf("answered entry = %+v, want door inbox: api agora.api.answer", ans)
	}
	if ans.BoundDigest != asked.ShownDigest || ans.ShownDigest != asked.ShownDigest {
		t.Errorf("answered entry: bound_digest %q shown_digest %q, want both the asked entry's %q", ans.BoundDigest, ans.ShownDigest, asked.ShownDigest)
	}
	publish(t, js, &lifecycle.Cancelled{Common: lifecycle.Common{DispatchID: ans.NextDispatchID, ThreadID: id, ParentID: id, Round: 1, Subagent: "coder"},
		By: "cli:erin", Reason: "wrong repository"})
	waitEntry(t, js, "the cancelled entry", func(e audit.Entry) bool { return e.Kind == audit.KindCancelled && e.By == "cli:erin" })
	waitEntry(t, js, "a checkpoint", func(e audit.Entry) bool { return e.Kind == audit.KindCheckpoint && e.Signature != "" })
	for _, e := range entries(t, js) {
		if b, _ := json.Marshal(e); strings.Contains(string(b), "never logged") {
			t.Fatalf("entry %d carries the partial state: %s", e.Seq, b)
		}
	}

	full := export(t, js, auditlog.Filter{})
	pub, err := audit.ReadPublicKey(pubFile)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Verify(bytes.NewReader(full), audit.VerifyOptions{PublicKey: pub, RequireSigned: true})
	if err != nil || !rep.Complete || rep.Signed == 0 {
		t.Fatalf("Verify = %+v, %v", rep, err)
	}
	if out, ok := verifyPy(t, full); !ok || !strings.Contains(out, "ok: complete export") {
		t.Fatalf("verify.py on the export: %s", out)
	}
	t.Logf("export:\n%s", full)

	tampered := bytes.Replace(full, []byte(`"answered_by":"dana"`), []byte(`"answered_by":"mallory"`), 1)
	if bytes.Equal(tampered, full) {
		t.Fatal("nothing to tamper with")
	}
	if out, ok := verifyPy(t, tampered); ok || !strings.Contains(out, "altered") {
		t.Fatalf("verify.py accepted a tampered export: %s", out)
	}
	unbound := bytes.Replace(full, []byte(`"bound_digest":"`+ans.BoundDigest+`",`), nil, 1)
	if bytes.Equal(unbound, full) {
		t.Fatal("no bound_digest to remove")
	}
	if out, ok := verifyPy(t, unbound); ok || !strings.Contains(out, "altered") {
		t.Fatalf("verify.py accepted an export whose answer's binding was removed: %s", out)
	}
	var p *audit.Problem
	if _, err := audit.Verify(bytes.NewReader(tampered), audit.VerifyOptions{PublicKey: pub}); !errors.As(err, &p) || p.What != audit.ProblemAltered || p.Seq != ans.Seq {
		t.Fatalf("Verify of the tampered export = %v, want entry %d altered", err, ans.Seq)
	}

	thread := export(t, js, auditlog.Filter{Thread: id})
	rep, err = audit.Verify(bytes.NewReader(thread), audit.VerifyOptions{PublicKey: pub})
	if err != nil || rep.Complete {
		t.Fatalf("Verify of the thread's export = %+v, %v", rep, err)
	}
	if out, ok := verifyPy(t, thread); !ok || !strings.Contains(out, "filtered") {
		t.Fatalf("verify.py on the thread's export: %s", out)
	}
}

func question(qid, route string, ev lifecycle.QuestionEvent) *lifecycle.Question {
	return &lifecycle.Question{Common: lifecycle.Common{DispatchID: "d-" + qid, ThreadID: "t-" + qid, Subagent: "coder"},
		QuestionID: qid, Event: ev, Status: string(ev), Route: route, Question: "?", AskedAt: time.Now().UTC()}
}

// A writer stopped and started again, and two writers at once, append
// each event once to one unbroken chain.
func TestOneChainAcrossRestartsAndWriters(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	stop := startWriter(t, srv, auditlog.Config{CheckpointEvery: 4})
	ask := func(n int) {
		for range n {
			publish(t, js, question("q-"+lifecycle.NewID(), "human", lifecycle.QuestionAsked))
		}
	}
	count := func() int {
		n := 0
		for _, e := range entries(t, js) {
			if e.Kind == audit.KindAsked {
				n++
			}
		}
		return n
	}
	ask(3)
	testkit.Eventually(t, 20*time.Second, "3 entries", func() bool { return count() == 3 })
	stop()
	ask(3)
	startWriter(t, srv, auditlog.Config{CheckpointEvery: 4})
	startWriter(t, srv, auditlog.Config{CheckpointEvery: 4})
	ask(6)
	testkit.Eventually(t, 20*time.Second, "12 entries", func() bool { return count() == 12 })

	seen := map[string]bool{}
	for _, e := range entries(t, js) {
		if e.SourceID != "" && seen[e.SourceID] {
			t.Errorf("event %s appended twice", e.SourceID)
		}
		seen[e.SourceID] = true
	}
	if _, err := audit.Verify(bytes.NewReader(export(t, js, auditlog.Filter{})), audit.VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Question events removed before the writer read them become a gap entry
// naming the missing sequences.
func TestGapEntry(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	for range 3 {
		publish(t, js, question("q-"+lifecycle.NewID(), "human", lifecycle.QuestionAsked))
	}
	st, err := js.Stream(t.Context(), lifecycle.StreamQuestions)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	startWriter(t, srv, auditlog.Config{})
	g := waitEntry(t, js, "a gap entry", func(e audit.Entry) bool { return e.Kind == audit.KindGap })
	if g.Source != lifecycle.StreamQuestions || g.GapFrom != 2 || g.GapTo != 2 {
		t.Fatalf("gap entry = %+v", g)
	}
	testkit.Eventually(t, 20*time.Second, "the events around the gap", func() bool { return len(entries(t, js)) == 3 })
}

// A question that joins one already asked is in the log when it joins,
// before any answer: a joined entry naming the question it joined. The
// answer then ends it through that question's door.
func TestJoinLoggedWhenItHappens(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	rt, err := router.New(router.Config{RecordWait: time.Millisecond, Tick: 50 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: srv.Conn(t), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "router", rt.Run)
	testkit.WaitReady(t, 20*time.Second, "router", rt.Ready())
	startWriter(t, srv, auditlog.Config{})

	ask := func() string {
		id := lifecycle.NewID()
		publish(t, js, &lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "coder"},
			QuestionID: lifecycle.QuestionID(id), Question: "Name the loader?", Options: []string{"readConfig", "parseConfig"}, Kind: "decision"})
		return lifecycle.QuestionID(id)
	}
	first := ask()
	waitEntry(t, js, "the asked entry", func(e audit.Entry) bool { return e.Kind == audit.KindAsked && e.QuestionID == first })
	second := ask()
	joined := waitEntry(t, js, "the joined entry", func(e audit.Entry) bool { return e.QuestionID == second && e.Kind != audit.KindAnswered })
	if joined.Kind != audit.KindJoined || joined.JoinedTo != first || joined.Route != "human" || joined.Source != lifecycle.StreamQuestions {
		t.Fatalf("entry of the joining question = %+v, want joined to %s", joined, first)
	}
	if _, err := srv.Client(t).Answer(t.Context(), first, lifecycle.Answer{Answer: "parseConfig", AnsweredBy: "dana"}); err != nil {
		t.Fatal(err)
	}
	ans := waitEntry(t, js, "the joined question's answer", func(e audit.Entry) bool { return e.Kind == audit.KindAnswered && e.QuestionID == second })
	if ans.Door != "join:"+first || ans.Seq <= joined.Seq {
		t.Fatalf("answered entry = %+v, want door join:%s after seq %d", ans, first, joined.Seq)
	}
}

// A dispatch a worker refused below the operator's sandbox floor is a
// refused entry naming who refused it and each setting; any other failure
// is no step of the log.
func TestFloorRefusalEntry(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	startWriter(t, srv, auditlog.Config{})
	common := func() lifecycle.Common {
		id := lifecycle.NewID()
		return lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "boxed"}
	}
	plain, refused := common(), common()
	publish(t, js, &lifecycle.Failed{Common: plain, Reason: lifecycle.ReasonProviderFailed, Detail: "exit 1"})
	publish(t, js, &lifecycle.Failed{Common: refused, Producer: lifecycle.Producer{WorkerID: "worker-7", Attempt: 1}, Reason: lifecycle.ReasonRejected,
		Detail:     `sub-agent "boxed" (revision 3) is below the operator's sandbox floor: sandbox.mode "off" is below the operator's floor "standard" (AGORA_SANDBOX_FLOOR)`,
		BelowFloor: []string{`sandbox.mode "off" is below the operator's floor "standard" (AGORA_SANDBOX_FLOOR)`}})
	last := common()
	publish(t, js, &lifecycle.Cancelled{Common: last, By: "cli:erin"})
	waitEntry(t, js, "the cancel after both", func(e audit.Entry) bool { return e.Kind == audit.KindCancelled && e.DispatchID == last.DispatchID })
	var got []audit.Entry
	for _, e := range entries(t, js) {
		if e.DispatchID == plain.DispatchID || e.DispatchID == refused.DispatchID {
			got = append(got, e)
		}
	}
	if len(got) != 1 {
		t.Fatalf("entries of the two failures = %+v, want the refusal only", got)
	}
	if e := got[0]; e.Kind != audit.KindRefused || e.DispatchID != refused.DispatchID || e.By != "worker:worker-7" ||
		!strings.Contains(e.Detail, `sandbox.mode "off"`) || !strings.Contains(e.Reason, "revision 3") || e.Source != lifecycle.StreamLifecycle {
		t.Fatalf("refused entry = %+v", e)
	}
	if out, ok := verifyPy(t, export(t, js, auditlog.Filter{})); !ok {
		t.Fatalf("verify.py: %s", out)
	}
}

// A person's reversal of an accepted suggestion is a reversed entry naming
// who reversed it, the suggestion, the cancelled and the new dispatch,
// after the cancelled entry of the resumed dispatch. Another route's door,
// a reverser that is no person, and a reversal after the thread went on
// are refused and log nothing.
func TestReversalEntry(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - name: bots\n    match: {subagent: \"bot-*\"}\n    answerer: bot\n    auto_accept: 0.9\n  - name: human\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rt, err := router.New(router.Config{RoutesFile: routes, RecordWait: time.Millisecond, Tick: 50 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: srv.Conn(t), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "router", rt.Run)
	testkit.WaitReady(t, 20*time.Second, "router", rt.Ready())
	startWriter(t, srv, auditlog.Config{})
	c := srv.Client(t)

	suggested := func() (qid, resumed string) {
		t.Helper()
		id := lifecycle.NewID()
		qid = lifecycle.QuestionID(id)
		publish(t, js, &lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "bot-coder"},
			QuestionID: qid, Question: "Name the loader?", Options: []string{"readConfig", "parseConfig"}, Kind: "decision"})
		waitEntry(t, js, "the asked entry", func(e audit.Entry) bool { return e.Kind == audit.KindAsked && e.QuestionID == qid })
		conf := 0.95
		body, _ := json.Marshal(client.Submission{QuestionID: qid, Answer: "parseConfig", AnsweredBy: "bot", Suggest: true, Confidence: &conf})
		if _, err := srv.Conn(t).Request("agora.api.answer.bots", body, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		ans := waitEntry(t, js, "the suggestion's answer", func(e audit.Entry) bool { return e.Kind == audit.KindAnswered && e.QuestionID == qid })
		if ans.Door != "suggestion" || ans.NextDispatchID == "" {
			t.Fatalf("answered entry = %+v", ans)
		}
		return qid, ans.NextDispatchID
	}
	refused := func(route string, req client.ReverseRequest, status int) {
		t.Helper()
		var p *client.Problem
		if _, err := c.Reverse(t.Context(), route, req); !errors.As(err, &p) || p.Status != status {
			t.Fatalf("reverse %+v on %s = %v, want %d", req, route, err, status)
		}
	}

	qid, resumed := suggested()
	refused("human", client.ReverseRequest{QuestionID: qid, Answer: "readConfig", ReversedBy: "mallory"}, 404)
	refused("bots", client.ReverseRequest{QuestionID: qid, Answer: "readConfig", ReversedBy: "suggested:bot"}, 422)
	refused("bots", client.ReverseRequest{QuestionID: qid, Answer: "loadConfig", ReversedBy: "alice"}, 422)
	rep, err := c.Reverse(t.Context(), "bots", client.ReverseRequest{QuestionID: qid, Answer: "readConfig", ReversedBy: "alice", Comment: "keep the old name"})
	if err != nil || rep.CancelledDispatchID != resumed || rep.NextDispatchID == "" || rep.NextDispatchID == resumed {
		t.Fatalf("Reverse = %+v, %v", rep, err)
	}
	rv := waitEntry(t, js, "the reversed entry", func(e audit.Entry) bool { return e.Kind == audit.KindReversed && e.QuestionID == qid })
	if rv.By != "alice" || rv.AnsweredBy != "alice" || rv.Answer != "readConfig" || rv.ReversedAnswer != "parseConfig" || rv.SuggestionBy != "bot" ||
		rv.SuggestionConfidence != "0.95" || rv.CancelledDispatchID != resumed || rv.NextDispatchID != rep.NextDispatchID || rv.Comment != "keep the old name" {
		t.Fatalf("reversed entry = %+v", rv)
	}
	cancelled := waitEntry(t, js, "the cancel of the resumed dispatch", func(e audit.Entry) bool { return e.Kind == audit.KindCancelled && e.DispatchID == resumed })
	if cancelled.By != "alice" {
		t.Errorf("cancelled entry = %+v", cancelled)
	}
	refused("bots", client.ReverseRequest{QuestionID: qid, Answer: "parseConfig", ReversedBy: "alice"}, 422) // reversed already

	// Too late: the resumed dispatch finished.
	late, resumed2 := suggested()
	publish(t, js, &lifecycle.Finished{Common: lifecycle.Common{DispatchID: resumed2, ThreadID: strings.TrimPrefix(late, "q-"), ParentID: strings.TrimPrefix(late, "q-"), Round: 1, Subagent: "bot-coder"}})
	refused("bots", client.ReverseRequest{QuestionID: late, Answer: "readConfig", ReversedBy: "alice"}, 409)
	for _, e := range entries(t, js) {
		if e.QuestionID == late && e.Kind == audit.KindReversed {
			t.Fatalf("a refused reversal was logged: %+v", e)
		}
	}
	exp := export(t, js, auditlog.Filter{Thread: strings.TrimPrefix(qid, "q-")})
	t.Logf("the reversed thread's trail:\n%s", exp)
	if out, ok := verifyPy(t, exp); !ok {
		t.Fatalf("verify.py: %s", out)
	}
}
