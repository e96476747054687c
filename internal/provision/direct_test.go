package provision_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A lifecycle stream provisioned before direct gets is updated in place to
// allow them, keeping its events; afterwards a stream handle reads a
// dispatch's last event by direct get — by the fence's wildcard filter too —
// and never through the leader's STREAM.MSG.GET API (docs/wire.md,
// "Reads by direct get").
func TestLifecycleReadsByDirectGet(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ctx := t.Context()
	var old jetstream.StreamConfig
	for _, sc := range provision.Streams(provision.Config{}) {
		if sc.Name == lifecycle.StreamLifecycle {
			old = sc
		}
	}
	if !old.AllowDirect {
		t.Fatalf("%s is provisioned without AllowDirect", lifecycle.StreamLifecycle)
	}
	old.AllowDirect = false
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, subj := range []string{"agora.lifecycle.accepted.t1.d1", "agora.lifecycle.started.t1.d1", "agora.lifecycle.accepted.t1.d2", "agora.lifecycle.finished.t1.d1"} {
		ack, err := js.Publish(ctx, subj, []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
	}
	created := streamInfo(t, js, lifecycle.StreamLifecycle).Created

	var changes []string
	ensure(t, js, provision.Config{Changed: func(s string) { changes = append(changes, s) }})
	if want := "stream AGORA_LIFECYCLE updated: direct get false → true"; !strings.Contains(strings.Join(changes, "\n"), want) {
		t.Errorf("changes lack %q: %q", want, changes)
	}
	info := streamInfo(t, js, lifecycle.StreamLifecycle)
	if !info.Config.AllowDirect || !info.Created.Equal(created) || info.State.Msgs != 4 {
		t.Errorf("after the update: allow direct %t, created %v (was %v), %d messages (want 4)", info.Config.AllowDirect, info.Created, created, info.State.Msgs)
	}

	// Every request on either read path, seen by a plain subscriber.
	nc := srv.Conn(t)
	direct, api := make(chan *nats.Msg, 64), make(chan *nats.Msg, 64)
	if _, err := nc.ChanSubscribe("$JS.API.DIRECT.GET."+lifecycle.StreamLifecycle+".>", direct); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.ChanSubscribe("$JS.API.DIRECT.GET."+lifecycle.StreamLifecycle, direct); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.ChanSubscribe("$JS.API.STREAM.MSG.GET."+lifecycle.StreamLifecycle, api); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	s, err := js.Stream(ctx, lifecycle.StreamLifecycle)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		filter  string
		subject string
		seq     uint64
	}{
		{lifecycle.LifecycleFilter("", "t1", "d1"), "agora.lifecycle.finished.t1.d1", seqs[3]}, // the fence's filter
		{lifecycle.LifecycleFilter("", "t1", "d2"), "agora.lifecycle.accepted.t1.d2", seqs[2]},
		{"agora.lifecycle.started.t1.d1", "agora.lifecycle.started.t1.d1", seqs[1]},
	} {
		m, err := s.GetLastMsgForSubject(ctx, c.filter)
		if err != nil {
			t.Errorf("last of %s: %v", c.filter, err)
			continue
		}
		if m.Subject != c.subject || m.Sequence != c.seq {
			t.Errorf("last of %s: %s #%d, want %s #%d", c.filter, m.Subject, m.Sequence, c.subject, c.seq)
		}
	}
	if _, err := s.GetLastMsgForSubject(ctx, lifecycle.LifecycleFilter("", "t1", "d3")); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("last of a dispatch with no events: %v, want ErrMsgNotFound", err)
	}
	if m, err := s.GetMsg(ctx, seqs[0]); err != nil || m.Subject != "agora.lifecycle.accepted.t1.d1" {
		t.Errorf("message #%d: %v %v", seqs[0], m, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(direct) != 5 || len(api) != 0 {
		t.Errorf("%d direct gets and %d STREAM.MSG.GET requests, want 5 and 0", len(direct), len(api))
	}
}
