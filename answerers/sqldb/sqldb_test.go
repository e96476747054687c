package sqldb_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/answerers/sqldb"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

func TestRewrite(t *testing.T) {
	q := func(n int) string { return "$" + strconv.Itoa(n) }
	tests := []struct {
		name, in, want string
		params         []string
		err            string
	}{
		{"named", "SELECT a FROM t WHERE s = :subagent AND q = :question", "SELECT a FROM t WHERE s = $1 AND q = $2", []string{"subagent", "question"}, ""},
		{"repeated", "SELECT :kind, :kind, :target", "SELECT $1, $1, $2", []string{"kind", "target"}, ""},
		{"in strings", "SELECT ':question', \"x:kind\", `:target` WHERE c = :context", "SELECT ':question', \"x:kind\", `:target` WHERE c = $1", []string{"context"}, ""},
		{"doubled quote", "SELECT 'it''s :question' || :question", "SELECT 'it''s :question' || $1", []string{"question"}, ""},
		{"cast", "SELECT :question::text, x::int", "SELECT $1::text, x::int", []string{"question"}, ""},
		{"comments", "SELECT 1 -- :question\n/* :kind */ WHERE :target", "SELECT 1 -- :question\n/* :kind */ WHERE $1", []string{"target"}, ""},
		{"dollar quoted", "SELECT $$ :question $$, $tag$ :kind $tag$, :subagent", "SELECT $$ :question $$, $tag$ :kind $tag$, $1", []string{"subagent"}, ""},
		{"time literal", "SELECT '10:30'", "SELECT '10:30'", nil, ""},
		{"unknown", "SELECT :nope", "", nil, "unknown parameter :nope"},
		{"unterminated", "SELECT 'x", "", nil, "unterminated"},
		{"empty", "  ", "", nil, "empty query"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, params, err := sqldb.Rewrite(tt.in, q)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want || fmt.Sprint(params) != fmt.Sprint(tt.params) {
				t.Fatalf("Rewrite = %q %v %v, want %q %v", got, params, err, tt.want, tt.params)
			}
		})
	}
}

// exercise runs the answerer's cases against a database holding the
// answers table.
func exercise(t *testing.T, a *sqldb.Answerer, db *sql.DB) {
	t.Helper()
	ctx := t.Context()
	q := func(question, sub string) lifecycle.Question {
		return lifecycle.Question{Common: lifecycle.Common{Subagent: sub}, Question: question, Kind: "decision", Target: "repo"}
	}
	tests := []struct {
		q    lifecycle.Question
		want answerer.Reply
	}{
		{q("Which region?", "data-loader"), answerer.Answer("eu-west-1")},
		{q("How many shards?", "data-loader"), answerer.Answer("12")},
		{q("Which region?", "someone-else"), answerer.Decline("the database has no row for this question")},
		{q("Owner?", "data-loader"), answerer.Decline("the database answered NULL or an empty value")},
	}
	for _, tt := range tests {
		got, err := a.Handle(ctx, tt.q)
		if err != nil || got != tt.want {
			t.Errorf("Handle(%q, %s) = %+v, %v; want %+v", tt.q.Question, tt.q.Subagent, got, err, tt.want)
		}
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE answers"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Handle(ctx, q("Which region?", "data-loader")); err == nil {
		t.Error("a failing query gives no error; it must be retried")
	}
}

const seed = `CREATE TABLE answers (subagent TEXT, question TEXT, target TEXT, answer TEXT, shards INTEGER);
INSERT INTO answers VALUES ('data-loader', 'Which region?', 'repo', 'eu-west-1', NULL);
INSERT INTO answers VALUES ('data-loader', 'How many shards?', 'repo', NULL, 12);
INSERT INTO answers VALUES ('data-loader', 'Owner?', 'repo', NULL, NULL);`

const query = `SELECT COALESCE(answer, CAST(shards AS TEXT)) FROM answers
WHERE subagent = :subagent AND question = :question AND target = :target -- :kind is not used
ORDER BY answer`

// seeded opens the database dsn with driver and runs seed on it; the
// handle is closed when the test ends.
func seeded(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, stmt := range strings.Split(seed, ";\n") {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("seed %s: %v", driver, err)
		}
	}
	return db
}

func TestSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "answers.db")
	db := seeded(t, sqldb.DriverSQLite, path)
	if _, err := sqldb.Open(sqldb.Config{DSN: path, Query: "SELEC nonsense"}); err == nil {
		t.Error("Open accepted a query with a syntax error")
	}
	a, err := sqldb.Open(sqldb.Config{DSN: path, Query: query})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	exercise(t, a, db)
}

// postgresDSN returns the test server's DSN. Without a reachable server the
// test skips, except in CI (CI=true), where it fails.
func postgresDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("AGORA_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	db, err := sql.Open(sqldb.DriverPostgres, dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		_ = db.Close()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL at AGORA_TEST_POSTGRES_DSN is required in CI: %v", err)
		}
		t.Skipf("no PostgreSQL reachable (set AGORA_TEST_POSTGRES_DSN): %v", err)
	}
	return dsn
}

func TestPostgres(t *testing.T) {
	dsn := postgresDSN(t)
	if got := sqldb.DriverFor(dsn); got != sqldb.DriverPostgres {
		t.Fatalf("DriverFor(%q) = %s", dsn, got)
	}
	// A schema of its own, so parallel runs do not meet.
	schema := "agora_test_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	admin, err := sql.Open(sqldb.DriverPostgres, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE") })
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	sdsn := dsn + sep + "search_path=" + schema
	db := seeded(t, sqldb.DriverPostgres, sdsn)
	// A PostgreSQL cast and dollar quotes stay as they are.
	a, err := sqldb.Open(sqldb.Config{DSN: sdsn, Query: strings.Replace(query, "CAST(shards AS TEXT)", "shards::text || $$$$", 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	exercise(t, a, db)
}
