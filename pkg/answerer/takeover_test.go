package answerer_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TestServeWarnsOfWaitingQuestions: an answerer started on a route where
// questions already wait (a toy answerer served on route human) says how
// many it is taking over; on an empty route it says nothing.
func TestServeWarnsOfWaitingQuestions(t *testing.T) {
	records := []lifecycle.Question{
		{QuestionID: "q-1", Status: "asked", Route: "human"},
		{QuestionID: "q-2", Status: "asked", Route: "human"},
		{QuestionID: "q-3", Status: "answered", Route: "human"},
		{QuestionID: "q-4", Status: "asked", Route: "bots"},
	}
	tests := []struct {
		route string
		want  string // the warning's waiting attribute; "" for no warning
	}{
		{"human", "waiting=2"},
		{"bots", "waiting=1"},
		{"empty", ""},
	}
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	kv, err := js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range records {
		b, _ := json.Marshal(q)
		if _, err := kv.Put(t.Context(), q.QuestionID, b); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.route, func(t *testing.T) {
			var buf testkit.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			h := answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
				return answerer.Decline("test"), nil
			})
			go func() {
				done <- answerer.Serve(ctx, srv.Conn(t), tt.route, h, answerer.WithLogger(log),
					answerer.WithDurable("takeover-"+tt.route), answerer.WithRemoveOnExit())
			}()
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(buf.String(), "answerer serving") && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Serve: %v", err)
			}
			var warn string
			for _, line := range strings.Split(buf.String(), "\n") {
				if strings.Contains(line, "level=WARN") && strings.Contains(line, "will be answered by this answerer") {
					warn = line
				}
			}
			switch {
			case tt.want == "" && warn != "":
				t.Errorf("warned on a route with nothing waiting: %s", warn)
			case tt.want != "" && (!strings.Contains(warn, tt.want) || !strings.Contains(warn, "route="+tt.route)):
				t.Errorf("want a warning with %s and route=%s; log:\n%s", tt.want, tt.route, buf.String())
			}
		})
	}
}
