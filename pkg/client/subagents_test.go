package client_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

func TestApplyListAndGetSubagents(t *testing.T) {
	c := natstest.StartProvisioned(t, provision.Config{}).Client(t)
	ctx := t.Context()
	if _, err := c.Subagent(ctx, "coder"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Subagent of an unknown name: %v, want ErrNotFound", err)
	}
	coder := subagent.Definition{Name: "coder", Runtime: subagent.RuntimeExec, Command: []string{"./code"}}
	first, err := c.ApplySubagent(ctx, coder)
	if err != nil || first.Result != client.AppliedCreated || first.Revision == 0 {
		t.Fatalf("first apply: %+v, %v", first, err)
	}
	same, err := c.ApplySubagent(ctx, coder)
	if err != nil || same.Result != client.AppliedUnchanged || same.Revision != first.Revision {
		t.Fatalf("the same definition again: %+v, %v (want unchanged at revision %d)", same, err, first.Revision)
	}
	coder.Timeout = "5m"
	upd, err := c.ApplySubagent(ctx, coder)
	if err != nil || upd.Result != client.AppliedUpdated || upd.Revision <= first.Revision {
		t.Fatalf("a changed definition: %+v, %v", upd, err)
	}
	if _, err := c.ApplySubagent(ctx, subagent.Definition{Name: "planner", Runtime: subagent.RuntimeExec, Command: []string{"./plan"}}); err != nil {
		t.Fatal(err)
	}

	got, err := c.Subagent(ctx, "coder")
	if err != nil || got.Revision != upd.Revision || got.Definition.Timeout != "5m" || got.UpdatedAt.IsZero() {
		t.Fatalf("Subagent(coder) = %+v, %v", got, err)
	}
	list, err := c.Subagents(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "coder" || list[1].Name != "planner" {
		t.Fatalf("Subagents = %+v, %v", list, err)
	}
}

func TestApplySubagentRefusesWhatCannotRun(t *testing.T) {
	c := natstest.StartProvisioned(t, provision.Config{}).Client(t)
	_, err := c.ApplySubagent(t.Context(), subagent.Definition{Name: "bad one", Runtime: "shell"})
	for _, want := range []string{"name:", "runtime:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("apply of an invalid definition: %v, want it to name %q", err, want)
		}
	}
	// A runtime no worker announced, named with what is offered; a typo
	// of one gets a suggestion.
	_, err = c.ApplySubagent(t.Context(), subagent.Definition{Name: "ok", Runtime: "shell", Command: []string{"x"}})
	if err == nil || !strings.Contains(err.Error(), `runtime: "shell" is offered by no worker; the workers offer claude-code, codex, exec, gemini-cli`) {
		t.Errorf("apply of a runtime nobody offers: %v", err)
	}
	_, err = c.ApplySubagent(t.Context(), subagent.Definition{Name: "ok", Runtime: "exc", Command: []string{"x"}})
	if err == nil || !strings.Contains(err.Error(), `runtime: "exc" is offered by no worker; did you mean exec?`) {
		t.Errorf("apply of a typo of exec: %v", err)
	}
	if list, err := c.Subagents(t.Context()); err != nil || len(list) != 0 {
		t.Errorf("an invalid definition was stored: %+v, %v", list, err)
	}
}

func TestSubagentsNamesUndecodable(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	c := srv.Client(t)
	if _, err := c.ApplySubagent(t.Context(), subagent.Definition{Name: "good", Runtime: subagent.RuntimeExec, Command: []string{"./x"}}); err != nil {
		t.Fatal(err)
	}
	kv, err := srv.JetStream(t).KeyValue(t.Context(), lifecycle.BucketSubagents)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "broken", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	list, err := c.Subagents(t.Context())
	var ue *client.UndecodableError
	if !errors.As(err, &ue) || len(ue.Names) != 1 || ue.Names[0] != "broken" || len(list) != 1 || list[0].Name != "good" {
		t.Fatalf("Subagents = %+v, %v", list, err)
	}
}
