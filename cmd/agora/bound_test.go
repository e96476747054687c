package main_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The CLI binds the answer it prints to what it printed: dispatch
// --round's answer lines carry --shown with the question's digest. The
// question asked anew reworded, that line is refused as changed (exit
// 1, saying how to see it as it stands) and answers nothing; questions
// show prints the new digest, and the answer with it is taken, bound to
// it, and the record names the CLI as its door.
func TestAnswerBound(t *testing.T) {
	t.Parallel()
	applyShell(t, "bound-approver", `if grep -q decision "$AGORA_INPUT_FILE"; then echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"; else echo '{"question":"Rotate the staging keys?","kind":"approval"}' > "$AGORA_NEEDS_INPUT_FILE"; fi`)
	r := agora(t, "dispatch", "bound-approver", "--round")
	m := regexp.MustCompile(`agora answer (q-\S+) approve --decision approve --shown (sha256:[0-9a-f]{64})`).FindStringSubmatch(r.stdout)
	if r.code != 4 || m == nil {
		t.Fatalf("dispatch --round prints no bound approve line: %s", r)
	}
	qid, shown := m[1], m[2]

	js := devServer(t).jetStream(t)
	now := natstest.RewordQuestion(t, js, qid, " And the production ones.")
	stale := agora(t, "answer", qid, "--decision", "approve", "--shown", shown)
	if stale.code != 1 || !strings.Contains(stale.stderr, "refused (changed)") || !strings.Contains(stale.stderr, "questions show "+qid) {
		t.Fatalf("the printed line after the question changed: %s", stale)
	}
	if q := jsonLines(t, mustAgora(t, "questions", "show", qid, "--json").stdout)[0]; q["status"] != "asked" || q["shown_digest"] != now {
		t.Fatalf("after the stale answer: %v, want asked showing %s", q, now)
	}
	if show := mustAgora(t, "questions", "show", qid); !strings.Contains(show.stdout, "production ones") || !strings.Contains(show.stdout, "--shown "+now) {
		t.Errorf("questions show does not print the question as it stands with its digest:\n%s", show.stdout)
	}
	if r := mustAgora(t, "answer", qid, "--decision", "approve", "--shown", now); !strings.Contains(r.stdout, "answered "+qid) {
		t.Errorf("the answer bound to the question as it stands: %s", r)
	}
	e, err := natstest.KeyValue(t, js, lifecycle.BucketQuestions).Get(t.Context(), qid)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(e.Value()), `"bound_digest":"`+now+`"`) {
		t.Errorf("the record does not say the answer was bound to %s: %s", now, e.Value())
	}
	if !strings.Contains(string(e.Value()), `"named_door":"cli"`) {
		t.Errorf("the record does not say the answer came through the CLI: %s", e.Value())
	}
}
