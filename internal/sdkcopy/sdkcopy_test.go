// Package sdkcopy_test copies each package example (pkg/*/example_test.go)
// into a fresh module outside the repository, whose go.mod holds exactly
// the require and replace lines docs/sdk.md tells SDK users to write, and
// builds it there: an example that imports internal/ or needs a file it
// does not carry fails, naming the example.
package sdkcopy_test

import (
	"bufio"
	"bytes"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const modulePath = "github.com/agora-dispatch/agora"

// repoRoot is the directory of the module's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("not inside the module")
	}
	return filepath.Dir(gomod)
}

// docLines are the require and replace lines of the go.mod block in
// docs/sdk.md, and the directory the replace points at.
func docLines(t *testing.T, root string) (lines []string, target string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "sdk.md"))
	if err != nil {
		t.Fatal(err)
	}
	require := regexp.MustCompile(`^require ` + regexp.QuoteMeta(modulePath) + ` v\S+$`)
	replace := regexp.MustCompile(`^replace ` + regexp.QuoteMeta(modulePath) + ` => (\S+)$`)
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case require.MatchString(line):
			lines = append(lines, line)
		case replace.MatchString(line):
			lines = append(lines, line)
			target = replace.FindStringSubmatch(line)[1]
		}
	}
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "require ") || target == "" {
		t.Fatalf("docs/sdk.md shows %q; want one require line of %s and then one replace line pointing at a checkout", lines, modulePath)
	}
	if filepath.IsAbs(target) {
		t.Fatalf("docs/sdk.md's replace points at %s; want a path relative to the user's module", target)
	}
	return lines, target
}

// goEnv is the environment of the go commands run in the copies: the
// machine's proxy, flags and module cache, modules resolved as go.mod
// says (no vendor directory, no workspace).
func goEnv() []string {
	flags := strings.TrimSpace(os.Getenv("GOFLAGS") + " -mod=mod")
	return append(os.Environ(), "GOFLAGS="+flags, "GOWORK=off")
}

func TestExamplesBuildInAFreshModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every package example in a module of its own")
	}
	root := repoRoot(t)
	lines, target := docLines(t, root)
	examples, err := filepath.Glob(filepath.Join(root, "pkg", "*", "example_test.go"))
	if err != nil || len(examples) == 0 {
		t.Fatalf("no package examples under %s/pkg (%v)", root, err)
	}
	for _, ex := range examples {
		rel, _ := filepath.Rel(root, ex)
		t.Run(filepath.Base(filepath.Dir(ex)), func(t *testing.T) {
			src, err := os.ReadFile(ex)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(token.NewFileSet(), rel, src, parser.ImportsOnly)
			if err != nil {
				t.Fatalf("%s: %v", rel, err)
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(p, modulePath+"/") && strings.Contains(p+"/", "/internal/") {
					t.Errorf("%s imports %s: an SDK user's module cannot import internal/", rel, p)
				}
			}
			// The user's module and, beside it where docs/sdk.md's
			// replace points, the checkout (a link to this repository).
			dir := t.TempDir()
			app := filepath.Join(dir, "app")
			checkout := filepath.Join(app, filepath.FromSlash(target))
			if err := os.MkdirAll(filepath.Dir(checkout), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(root, checkout); err != nil {
				t.Fatal(err)
			}
			pkgDir := filepath.Join(app, "example")
			if err := os.MkdirAll(pkgDir, 0o755); err != nil {
				t.Fatal(err)
			}
			gomod := "module example.com/app\n\ngo 1.26.0\n\n" + strings.Join(lines, "\n\n") + "\n"
			if err := os.WriteFile(filepath.Join(app, "go.mod"), []byte(gomod), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(pkgDir, "example_test.go"), src, 0o644); err != nil {
				t.Fatal(err)
			}
			// -run NONE builds the test binary and runs none of its
			// tests or examples.
			for _, args := range [][]string{{"mod", "tidy"}, {"vet", "./..."}, {"test", "-count=1", "-run", "NONE", "./..."}} {
				cmd := exec.Command("go", args...)
				cmd.Dir = app
				cmd.Env = goEnv()
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s copied into a fresh module: go %s: %v\n%s", rel, strings.Join(args, " "), err, out)
				}
			}
		})
	}
}
