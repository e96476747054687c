package agoratest_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/agoratest"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
)

func TestStartServesADispatcherAndStops(t *testing.T) {
	def := subagent.Definition{Name: "planner", Runtime: subagent.RuntimeExec, Command: []string{"./plan"}}
	a, err := agoratest.Start(t.Context(), agoratest.Options{Dispatcher: &dispatcher.Config{}, Router: &router.Config{},
		Subagents: []subagent.Definition{def}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			a.Stop()
		}
	}()
	c, err := client.Connect(a.URL)
	if err != nil {
		t.Fatal(err)
	}
	if sa, err := c.Subagent(t.Context(), "planner"); err != nil || sa.Definition.Command[0] != "./plan" {
		t.Fatalf("the registered sub-agent: %+v, %v", sa, err)
	}
	d, err := c.Dispatch(t.Context(), lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	// No worker runs: the dispatch is accepted and stays queued.
	rec, err := c.Status(t.Context(), d.DispatchID)
	if err != nil || rec.Status != lifecycle.KindAccepted {
		t.Fatalf("status: %+v, %v", rec, err)
	}
	c.Close()
	a.Stop()
	stopped = true
	if nc, err := nats.Connect(a.URL, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatalf("the server still answers at %s after Stop", a.URL)
	}
}

func TestStartRefusesAnInvalidSubagent(t *testing.T) {
	_, err := agoratest.Start(t.Context(), agoratest.Options{Subagents: []subagent.Definition{{Name: "bad one"}}})
	if err == nil || !strings.Contains(err.Error(), "name:") {
		t.Fatalf("Start with an invalid definition: %v, want it refused naming the field", err)
	}
}
