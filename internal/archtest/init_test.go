package archtest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// initAllowed is the one init allowed to take over a process: the sandbox
// launcher's, on argv[0] (docs/sandbox.md says why it stays an init).
var initAllowed = []string{"internal/sandbox/launcher/launcher_linux.go"}

// inits lists the non-test Go files under dir that declare an init
// function, relative to dir.
func inits(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != dir && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == "init" {
				rel, _ := filepath.Rel(dir, p)
				out = append(out, filepath.ToSlash(rel))
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// No package takes over a binary that imports it from an init: a service,
// answerer or helper runs only when a main calls it.
func TestNoInitTakeovers(t *testing.T) {
	_, dir := moduleRoot(t)
	for _, f := range inits(t, dir) {
		if !slices.Contains(initAllowed, f) {
			t.Errorf("%s declares an init: call it from main instead (only %v may)", f, initAllowed)
		}
	}
}

// The check finds an init where there is one.
func TestInitsFindsOne(t *testing.T) {
	dir := t.TempDir()
	for name, src := range map[string]string{
		"a/a.go":      "package a\n\nfunc init() {}\n",
		"a/a_test.go": "package a\n\nfunc init() {}\n",
		"b/b.go":      "package b\n\ntype T struct{}\n\nfunc (T) init() {}\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := inits(t, dir); !slices.Equal(got, []string{"a/a.go"}) {
		t.Fatalf("inits = %v, want [a/a.go]", got)
	}
}
