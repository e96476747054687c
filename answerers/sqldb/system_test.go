package sqldb_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/answerers/sqldb"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
)

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// TestDatabaseAnswer: a data sub-agent's question is answered from the
// database and the thread resumes with that answer; a question the
// database has no row for goes to the fallback route.
func TestDatabaseAnswer(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte(`routes:
  - name: data
    match: {subagent: "data-*"}
    answerer: sqldb
    fallback: people
  - name: people
    answerer: human
`), 0o600); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(dir, "answers.db")
	db, err := sql.Open(sqldb.DriverSQLite, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, stmt := range strings.Split(seed, ";\n") {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	a, err := sqldb.Open(sqldb.Config{DSN: dbPath, Query: "SELECT answer FROM answers WHERE subagent = :subagent AND question = :question"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	dconn, wconn, rconn, aconn := srv.Conn(t), srv.Conn(t), srv.Conn(t), srv.Conn(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	d, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: dconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("dispatcher", d.Run)
	w, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: 2, PullExpiry: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second}, worker.Deps{Conn: wconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("worker", w.Run)
	r, err := router.New(router.Config{RoutesFile: routes, Tick: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second}, router.Deps{Conn: rconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("router", r.Run)
	run("sqldb answerer", func(ctx context.Context) error {
		return answerer.Serve(ctx, aconn, "data", a, answerer.WithLogger(quietLogger()))
	})
	<-d.Ready()
	<-r.Ready()

	js, err := jetstream.New(dconn)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), lifecycle.BucketSubagents)
	if err != nil {
		t.Fatal(err)
	}
	// data-loader asks the question in its input and, resumed, copies its
	// input to its output.
	def, _ := json.Marshal(subagent.Definition{Name: "data-loader", Runtime: subagent.RuntimeExec, Timeout: "1m", Command: []string{"sh", "-c",
		`if [ "$AGORA_ROUND" = "0" ]; then printf '{"question":"%s"}' "$QUESTION" > "$AGORA_NEEDS_INPUT_FILE"; else cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"; fi`}})
	if _, err := kv.Put(t.Context(), "data-loader", def); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(dconn)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer wcancel()

	found, err := c.Dispatch(wctx, lifecycle.Request{Subagent: "data-loader", Env: map[string]string{"QUESTION": "Which region?"}})
	if err != nil {
		t.Fatal(err)
	}
	end, err := c.WaitThread(wctx, found.ThreadID, nil)
	if err != nil {
		t.Fatal(err)
	}
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok || fin.Round != 1 || !strings.Contains(string(fin.Output), `"answer":"eu-west-1"`) || !strings.Contains(string(fin.Output), `"answered_by":"answerer:data"`) {
		t.Fatalf("thread ended %+v", end.Data)
	}

	missing, err := c.Dispatch(wctx, lifecycle.Request{Subagent: "data-loader", Env: map[string]string{"QUESTION": "Which colour?"}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		qs, err := c.Questions(wctx, client.QuestionFilter{ThreadID: missing.ThreadID, Route: "people"})
		if err != nil {
			t.Fatal(err)
		}
		if len(qs) == 1 {
			if !strings.Contains(qs[0].Detail, "declined by data: the database has no row") {
				t.Errorf("detail = %q", qs[0].Detail)
			}
			break
		}
		select {
		case <-wctx.Done():
			t.Fatal("the question without a row never reached the fallback route")
		case <-time.After(50 * time.Millisecond):
		}
	}
}
