package answerer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TestServeWarnsOfWaitingQuestions: an answerer started on a route where
// questions already wait (a toy answerer served on route human) says how
// many it is taking over; on an empty route it says nothing.
func TestServeWarnsOfWaitingQuestions(t *testing.T) {
	e := newEnv(t)
	// Waiting on route people: two (a third is answered); on route bot:
	// one; on route keeper: none. The count is the router's, for the
	// route alone (agora.api.questions.<route>).
	var people []string
	for _, q := range []string{"Ship it?", "Which region?", "Rename it?"} {
		people = append(people, e.ask("planner", q))
	}
	bot := e.ask("bot-x", "Retry the job?")
	for _, qid := range append(people, bot) {
		e.waitQuestion(qid, func(q lifecycle.Question) bool { return q.Status == "asked" })
	}
	if _, err := e.c.Answer(t.Context(), people[2], lifecycle.Answer{Answer: "yes", AnsweredBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	e.waitQuestion(people[2], func(q lifecycle.Question) bool { return q.Status == "answered" })
	tests := []struct {
		route string
		want  string // the warning's waiting attribute; "" for no warning
	}{
		{"people", "waiting=2"},
		{"bot", "waiting=1"},
		{"keeper", ""},
	}
	srv := e.srv
	for _, tt := range tests {
		t.Run(tt.route, func(t *testing.T) {
			var buf testkit.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			// Answers nothing: the questions keep waiting for the next case.
			h := answerer.HandlerFunc(func(ctx context.Context, _ lifecycle.Question) (answerer.Reply, error) {
				<-ctx.Done()
				return answerer.Reply{}, ctx.Err()
			})
			go func() {
				done <- answerer.Serve(ctx, srv.Conn(t), tt.route, h, answerer.WithLogger(log),
					answerer.WithDurable("takeover-"+tt.route), answerer.WithRemoveOnExit(), answerer.WithShutdownTimeout(-1))
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
