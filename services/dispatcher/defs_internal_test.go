package dispatcher

import (
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// The copy's rules (docs/dispatcher.md, "Definitions") with the copy held
// still — no watch runs — so what the bucket holds and what the copy holds
// differ on purpose. The black-box tests in defs_test.go cannot tell these
// paths from a watch that happened to be quick.
func TestDefinitionsCopyRules(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	kv := natstest.KeyValue(t, js, lifecycle.BucketSubagents)
	put := func(d subagent.Definition) uint64 {
		t.Helper()
		data, _ := json.Marshal(d)
		rev, err := kv.Put(t.Context(), d.Name, data)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	s := &Service{log: slog.New(slog.DiscardHandler)}
	b := &bindings{subagents: kv}
	s.defs.setLive(true) // a live copy that no watch updates

	t.Run("a name the copy lacks is read from the bucket", func(t *testing.T) {
		rev := put(subagent.Definition{Name: "unseen", Runtime: subagent.RuntimeExec, Command: []string{"true"}})
		d, err := s.lookup(t.Context(), b, "unseen", false)
		if err != nil || d.rev != rev {
			t.Fatalf("lookup = rev %d, %v; want %d", d.rev, err, rev)
		}
		if _, err := s.lookup(t.Context(), b, "nobody", false); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("lookup of an unregistered name = %v, want ErrKeyNotFound", err)
		}
	})

	t.Run("an env refusal reads the bucket", func(t *testing.T) {
		def := subagent.Definition{Name: "widened", Runtime: subagent.RuntimeExec, Command: []string{"true"}}
		old := put(def)
		if _, err := s.lookup(t.Context(), b, "widened", false); err != nil { // the copy now holds old
			t.Fatal(err)
		}
		def.EnvAllow = []string{"BAR"}
		rev := put(def)
		if d, _ := s.lookup(t.Context(), b, "widened", false); d.rev != old {
			t.Fatalf("the copy holds rev %d, want the stale %d for this test", d.rev, old)
		}
		req := lifecycle.Request{Subagent: "widened", Env: map[string]string{"BAR": "1"}}
		_, got, err := s.validate(t.Context(), b, &req, 10)
		if err != nil || got != rev {
			t.Errorf("validate with BAR = rev %d, %v; want rev %d accepted", got, err, rev)
		}
		// Without a refusal the copy is used as it is.
		req = lifecycle.Request{Subagent: "widened"}
		if _, got, err := s.validate(t.Context(), b, &req, 10); err != nil || got != rev {
			t.Errorf("validate without env = rev %d, %v; want %d (the copy took the fresh read)", got, err, rev)
		}
		// A variable no revision allows is still refused.
		req = lifecycle.Request{Subagent: "widened", Env: map[string]string{"BAZ": "1"}}
		var p *client.Problem
		if _, _, err := s.validate(t.Context(), b, &req, 10); !errors.As(err, &p) || p.Field("env") == "" {
			t.Errorf("validate with BAZ = %v, want a refusal naming env", err)
		}
	})

	t.Run("a read older than a deletion does not bring it back", func(t *testing.T) {
		s.defs.set("gone", definition{rev: 5})
		s.defs.remove("gone", 6)
		s.defs.set("gone", definition{rev: 5}) // a read that started before the deletion
		if _, ok := s.defs.get("gone"); ok {
			t.Error("the deleted definition is back in the copy")
		}
		s.defs.set("gone", definition{rev: 7}) // registered again
		if d, ok := s.defs.get("gone"); !ok || d.rev != 7 {
			t.Errorf("after registering again: %+v %v", d, ok)
		}
	})

	t.Run("without a watch every lookup reads the bucket", func(t *testing.T) {
		s.defs.setLive(false)
		s.defs.set("idle", definition{rev: 1})
		if _, ok := s.defs.get("idle"); ok {
			t.Error("a copy without a watch answered")
		}
	})
}
