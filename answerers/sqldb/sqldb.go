// Package sqldb is an Agora answerer that answers a question with a SQL
// query over database/sql.
//
// The query uses named parameters that take the question's values:
//
//	:question  the question text
//	:subagent  the asking sub-agent
//	:kind      clarification, decision, information or approval
//	:context   the question's context
//	:target    the dispatch's target
//
// The first column of the first row is the answer (text, or a number,
// boolean or time written as text). No row, or NULL, declines the question,
// so the route's fallback gets it. A query error is retried by
// pkg/answerer with backoff and declines after the last attempt.
//
// A DSN starting with postgres:// or postgresql:// opens PostgreSQL
// through pgx; anything else is a SQLite database (a file name or a file:
// URI) opened with modernc.org/sqlite, which needs no cgo:
//
//	a, _ := sqldb.Open(sqldb.Config{
//		DSN:   "answers.db",
//		Query: "SELECT answer FROM answers WHERE subagent = :subagent AND question = :question",
//	})
//	defer a.Close()
//	err := answerer.Serve(ctx, nc, "data", a)
package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"

	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The database/sql drivers this package registers.
const (
	DriverSQLite   = "sqlite"
	DriverPostgres = "pgx"
)

// Params are the named parameters a query may use.
var Params = []string{"question", "subagent", "kind", "context", "target"}

// Config configures an Answerer.
type Config struct {
	// DSN names the database: postgres://… or postgresql://… for
	// PostgreSQL, otherwise a SQLite file name or file: URI.
	DSN string
	// Driver overrides the choice made from the DSN: "sqlite" or "pgx".
	Driver string
	// Query is the SQL query with named parameters (see Params).
	Query string
	// Timeout bounds one query; default 10s.
	Timeout time.Duration
}

// Answerer answers questions with a SQL query. It is an answerer.Handler,
// safe for concurrent use.
type Answerer struct {
	db      *sql.DB
	own     bool
	query   string   // with the driver's placeholders
	params  []string // the parameter of each placeholder, in order
	timeout time.Duration
}

// DriverFor returns the driver Open uses for dsn.
func DriverFor(dsn string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return DriverPostgres
	}
	return DriverSQLite
}

// Open opens the database, checks the query (parameters, and by preparing
// it, its syntax against the database) and returns an Answerer that owns
// the database handle: Close closes it.
func Open(cfg Config) (*Answerer, error) {
	if cfg.DSN == "" {
		return nil, errors.New("sqldb: empty DSN")
	}
	driver := cfg.Driver
	if driver == "" {
		driver = DriverFor(cfg.DSN)
	}
	db, err := sql.Open(driver, cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("sqldb: open %s: %w", driver, err)
	}
	a, err := New(db, driver, cfg.Query, cfg.Timeout)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	a.own = true
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	stmt, err := db.PrepareContext(ctx, a.query)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqldb: query: %w", err)
	}
	_ = stmt.Close()
	return a, nil
}

// New returns an Answerer running query on db, whose database/sql driver
// is driver ("sqlite" or "pgx": it decides the placeholders). The handle
// stays the caller's.
func New(db *sql.DB, driver, query string, timeout time.Duration) (*Answerer, error) {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	var ph func(int) string
	switch driver {
	case DriverSQLite:
		ph = func(n int) string { return "?" + strconv.Itoa(n) }
	case DriverPostgres:
		ph = func(n int) string { return "$" + strconv.Itoa(n) }
	default:
		return nil, fmt.Errorf("sqldb: driver %q: want %s or %s", driver, DriverSQLite, DriverPostgres)
	}
	q, params, err := Rewrite(query, ph)
	if err != nil {
		return nil, err
	}
	return &Answerer{db: db, query: q, params: params, timeout: timeout}, nil
}

// Close closes the database when Open opened it.
func (a *Answerer) Close() error {
	if a.own {
		return a.db.Close()
	}
	return nil
}

// Handle runs the query for q. No row or a NULL answer declines; a query
// error is returned, to be retried.
func (a *Answerer) Handle(ctx context.Context, q lifecycle.Question) (answerer.Reply, error) {
	values := map[string]string{"question": q.Question, "subagent": q.Subagent, "kind": string(q.Kind), "context": q.Context, "target": q.Target}
	args := make([]any, len(a.params))
	for i, p := range a.params {
		args[i] = values[p]
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, err := a.db.QueryContext(ctx, a.query, args...)
	if err != nil {
		return answerer.Reply{}, fmt.Errorf("sqldb: query: %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return answerer.Reply{}, fmt.Errorf("sqldb: query: %w", err)
		}
		return answerer.Decline("the database has no row for this question"), nil
	}
	cols, err := rows.Columns()
	if err != nil {
		return answerer.Reply{}, fmt.Errorf("sqldb: columns: %w", err)
	}
	dest := make([]any, len(cols))
	var first any
	dest[0] = &first
	for i := 1; i < len(dest); i++ {
		dest[i] = new(any)
	}
	if err := rows.Scan(dest...); err != nil {
		return answerer.Reply{}, fmt.Errorf("sqldb: scan: %w", err)
	}
	s, ok := text(first)
	if !ok || strings.TrimSpace(s) == "" {
		return answerer.Decline("the database answered NULL or an empty value"), nil
	}
	return answerer.Answer(s), nil
}

// text writes a column value as an answer.
func text(v any) (string, bool) {
	switch x := v.(type) {
	case nil:
		return "", false
	case string:
		return x, true
	case []byte:
		return string(x), true
	case time.Time:
		return x.Format(time.RFC3339Nano), true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), true
	case fmt.Stringer:
		return x.String(), true
	}
	return fmt.Sprint(v), true
}

// Rewrite replaces the named parameters of query (:name, outside string
// literals, quoted identifiers, comments and PostgreSQL :: casts) with
// placeholders made by ph from the parameter's number (from 1, one per
// distinct name) and returns the parameter name of each number. An unknown
// name is an error.
func Rewrite(query string, ph func(n int) string) (string, []string, error) {
	if strings.TrimSpace(query) == "" {
		return "", nil, errors.New("sqldb: empty query")
	}
	var b strings.Builder
	var params []string
	ident := func(c byte) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for i := 0; i < len(query); {
		c := query[i]
		switch {
		case c == '\'' || c == '"' || c == '`':
			j := i + 1
			for j < len(query) {
				if query[j] == c {
					if j+1 < len(query) && query[j+1] == c { // doubled quote
						j += 2
						continue
					}
					break
				}
				j++
			}
			if j >= len(query) {
				return "", nil, fmt.Errorf("sqldb: query: unterminated %c quote at byte %d", c, i)
			}
			b.WriteString(query[i : j+1])
			i = j + 1
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = len(query) - i
			}
			b.WriteString(query[i : i+j])
			i += j
		case c == '/' && i+1 < len(query) && query[i+1] == '*':
			j := strings.Index(query[i+2:], "*/")
			if j < 0 {
				return "", nil, fmt.Errorf("sqldb: query: unterminated comment at byte %d", i)
			}
			b.WriteString(query[i : i+2+j+2])
			i += 2 + j + 2
		case c == '$' && i+1 < len(query) && (query[i+1] == '$' || ident(query[i+1]) && (query[i+1] < '0' || query[i+1] > '9')):
			// A PostgreSQL dollar-quoted string: $tag$ … $tag$.
			end := strings.IndexByte(query[i+1:], '$')
			tag := ""
			if end >= 0 {
				tag = query[i : i+1+end+1]
			}
			if end < 0 || !isTag(tag) {
				b.WriteByte(c)
				i++
				continue
			}
			k := strings.Index(query[i+len(tag):], tag)
			if k < 0 {
				return "", nil, fmt.Errorf("sqldb: query: unterminated %s string at byte %d", tag, i)
			}
			b.WriteString(query[i : i+len(tag)+k+len(tag)])
			i += len(tag) + k + len(tag)
		case c == ':' && i+1 < len(query) && query[i+1] == ':':
			b.WriteString("::")
			i += 2
		case c == ':' && i+1 < len(query) && ident(query[i+1]) && (query[i+1] < '0' || query[i+1] > '9'):
			j := i + 1
			for j < len(query) && ident(query[j]) {
				j++
			}
			name := query[i+1 : j]
			if !slices.Contains(Params, name) {
				return "", nil, fmt.Errorf("sqldb: query: unknown parameter :%s (want :%s)", name, strings.Join(Params, ", :"))
			}
			n := slices.Index(params, name)
			if n < 0 {
				params = append(params, name)
				n = len(params) - 1
			}
			b.WriteString(ph(n + 1))
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), params, nil
}

// isTag reports whether s is a dollar-quote tag: $$ or $name$.
func isTag(s string) bool {
	if len(s) < 2 || s[0] != '$' || s[len(s)-1] != '$' {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 1 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
