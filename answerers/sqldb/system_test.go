package sqldb_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/answerers/sqldb"
	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TestDatabaseAnswer: a data sub-agent's question is answered from the
// database and the thread resumes with that answer; a question the
// database has no row for goes to the fallback route.
func TestDatabaseAnswer(t *testing.T) {
	sys := systemtest.Start(t, systemtest.Options{WorkerConcurrency: 2, Routes: `routes:
  - name: data
    match: {subagent: "data-*"}
    answerer: sqldb
    fallback: people
  - name: people
    answerer: human
`})
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "answers.db")
	seeded(t, sqldb.DriverSQLite, dbPath)
	a, err := sqldb.Open(sqldb.Config{DSN: dbPath, Query: "SELECT answer FROM answers WHERE subagent = :subagent AND question = :question"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	aconn := sys.Server.Conn(t)
	sys.Go("sqldb answerer", func(ctx context.Context) error {
		return answerer.Serve(ctx, aconn, "data", a, answerer.WithLogger(systemtest.Logger()))
	})
	// data-loader asks the question in its input and, resumed, copies its
	// input to its output.
	sys.Shell("data-loader", `if [ "$AGORA_ROUND" = "0" ]; then printf '{"question":"%s"}' "$QUESTION" > "$AGORA_NEEDS_INPUT_FILE"; else cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"; fi`, "QUESTION")
	c := sys.Client
	wctx, wcancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer wcancel()

	found, err := c.Dispatch(wctx, lifecycle.Request{Subagent: "data-loader", Env: map[string]string{"QUESTION": "Which region?"}})
	if err != nil {
		t.Fatal(err)
	}
	end, err := c.Follow(wctx, found.ThreadID, nil)
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
			if !strings.Contains(qs[0].Detail, "declined on route data by answerer:data: the database has no row") {
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
