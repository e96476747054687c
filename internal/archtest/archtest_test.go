package archtest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// pkg is the part of `go list -json` output the rules read.
type pkg struct {
	ImportPath string
	Deps       []string // every package it imports, directly or not
}

// topFloor are the folders of what assembles or drives a whole Agora:
// the CLI, the test Agora of the SDK users, the one assembler and the
// harness (benchmark, chaos audit, system tests).
var topFloor = []string{"cmd", "agoratest", "stack", "harness"}

// under reports whether the module-relative path rel is dir or inside it.
func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

// banned describes the import of d (drel relative to the module) by
// importer when drel is under one of dirs.
func banned(importer, d, drel, rule string, dirs ...string) []string {
	var out []string
	for _, dir := range dirs {
		if under(drel, dir) {
			out = append(out, importer+" imports "+d+": "+rule+" "+dir+"/")
		}
	}
	return out
}

// violations applies the import rules to pkgs of module and describes every
// broken one.
func violations(module string, pkgs []pkg) []string {
	local := func(path string) (rel string, ok bool) {
		if path == module {
			return "", true
		}
		rel, ok = strings.CutPrefix(path, module+"/")
		return rel, ok
	}
	// service returns X for services/X/...
	service := func(rel string) string {
		if !under(rel, "services") {
			return ""
		}
		parts := strings.SplitN(rel, "/", 3)
		if len(parts) < 2 {
			return ""
		}
		return parts[1]
	}

	var out []string
	for _, p := range pkgs {
		rel, ok := local(p.ImportPath)
		if !ok {
			continue
		}
		for _, d := range p.Deps {
			drel, ok := local(d)
			if !ok {
				continue
			}
			if under(rel, "internal/sandbox/launcher") && !under(drel, "internal/sandbox/launcher") {
				// The launcher is every run's PID 1 and starts for each run:
				// it carries nothing of the module but itself.
				out = append(out, p.ImportPath+" imports "+d+": internal/sandbox/launcher imports nothing of the module outside itself")
			}
			switch {
			case under(rel, "pkg/sentinel"):
				if !under(drel, "pkg/sentinel") {
					out = append(out, p.ImportPath+" imports "+d+": pkg/sentinel imports nothing from the module")
				}
			case under(rel, "pkg"):
				// The public packages stand alone: a program that imports
				// them gets nothing of the module from outside pkg/.
				if !under(drel, "pkg") {
					out = append(out, p.ImportPath+" imports "+d+": pkg/ imports nothing of the module outside pkg/")
				}
			}
			switch {
			case under(rel, "harness"):
				out = append(out, banned(p.ImportPath, d, drel, "harness/ never imports", "cmd")...)
			case under(rel, "stack"):
				out = append(out, banned(p.ImportPath, d, drel, "stack/ never imports", "cmd", "harness", "agoratest")...)
			case under(rel, "agoratest"):
				out = append(out, banned(p.ImportPath, d, drel, "agoratest/ never imports", "cmd", "harness")...)
			case under(rel, "internal"):
				// Runtime helpers sit below the services that use them.
				out = append(out, banned(p.ImportPath, d, drel, "internal/ runtime helpers never import", append([]string{"services", "answerers"}, topFloor...)...)...)
			case under(rel, "services"), under(rel, "answerers"):
				// What assembles or drives the whole system sits above it.
				out = append(out, banned(p.ImportPath, d, drel, "nothing below the top floor imports", topFloor...)...)
			}
			if x, y := service(rel), service(drel); x != "" && y != "" && x != y {
				out = append(out, p.ImportPath+" imports "+d+": services never import each other")
			}
		}
	}
	return out
}

func TestViolations(t *testing.T) {
	const m = "example.com/mod"
	tests := []struct {
		name string
		pkgs []pkg
		want int
	}{
		{"service imports pkg and internal", []pkg{{m + "/services/worker", []string{m + "/pkg/lifecycle", m + "/internal/config", "fmt"}}}, 0},
		{"service main imports its own service", []pkg{{m + "/services/worker/cmd/worker", []string{m + "/services/worker"}}}, 0},
		{"service subpackage imports its service", []pkg{{m + "/services/router/routes", []string{m + "/services/router/store"}}}, 0},
		{"cmd imports every service", []pkg{{m + "/cmd/agora", []string{m + "/services/worker", m + "/services/router"}}}, 0},
		{"answerer imports pkg", []pkg{{m + "/answerers/inbox", []string{m + "/pkg/answerer"}}}, 0},
		{"sentinel imports the standard library", []pkg{{m + "/pkg/sentinel", []string{"os", "encoding/json"}}}, 0},
		{"sentinel subpackage", []pkg{{m + "/pkg/sentinel/internal/x", []string{m + "/pkg/sentinel"}}}, 0},
		{"other modules are not ours", []pkg{{"other.org/services/a", []string{"other.org/services/b"}}}, 0},
		{"prefix lookalike", []pkg{{m + "/internal/provision", []string{m + "/servicesx/a", m + "/cmdline"}}}, 0},

		{"harness imports stack, services and answerers", []pkg{{m + "/harness/bench", []string{m + "/stack", m + "/services/worker", m + "/answerers/inbox", m + "/internal/config"}}}, 0},
		{"cmd imports stack and a harness", []pkg{{m + "/cmd/agora", []string{m + "/stack", m + "/harness/chaos"}}}, 0},
		{"stack imports services, answerers, internal and pkg", []pkg{{m + "/stack", []string{m + "/services/dispatcher", m + "/answerers/inbox", m + "/internal/natsserver", m + "/pkg/client"}}}, 0},
		{"agoratest imports stack", []pkg{{m + "/agoratest", []string{m + "/stack", m + "/services/router"}}}, 0},
		{"top-floor lookalike", []pkg{{m + "/services/worker", []string{m + "/stacks/x", m + "/harnessx", m + "/agoratestkit"}}}, 0},
		{"runtime helper imports pkg", []pkg{{m + "/internal/provision", []string{m + "/pkg/lifecycle", m + "/internal/config"}}}, 0},

		{"runtime helper imports a service", []pkg{{m + "/internal/provision", []string{m + "/services/dispatcher"}}}, 1},
		{"runtime helper imports an answerer", []pkg{{m + "/internal/telemetry", []string{m + "/answerers/inbox"}}}, 1},
		{"runtime helper imports a harness", []pkg{{m + "/internal/natstest", []string{m + "/harness/systemtest"}}}, 1},
		{"runtime helper imports stack", []pkg{{m + "/internal/svc", []string{m + "/stack"}}}, 1},
		{"runtime helper imports agoratest", []pkg{{m + "/internal/testkit", []string{m + "/agoratest"}}}, 1},
		{"runtime helper imports cmd", []pkg{{m + "/internal/config", []string{m + "/cmd/agora"}}}, 1},
		{"service imports a harness", []pkg{{m + "/services/worker", []string{m + "/harness/bench"}}}, 1},
		{"answerer imports a harness", []pkg{{m + "/answerers/slack", []string{m + "/harness/systemtest"}}}, 1},
		{"service main imports stack", []pkg{{m + "/services/router/cmd/router", []string{m + "/services/router", m + "/stack"}}}, 1},
		{"answerer imports agoratest", []pkg{{m + "/answerers/sqldb", []string{m + "/agoratest"}}}, 1},
		{"service imports cmd", []pkg{{m + "/services/dispatcher", []string{m + "/cmd/agora"}}}, 1},
		{"harness imports cmd", []pkg{{m + "/harness/chaos", []string{m + "/cmd/agora"}}}, 1},
		{"stack imports a harness", []pkg{{m + "/stack", []string{m + "/harness/bench"}}}, 1},
		{"stack imports cmd", []pkg{{m + "/stack", []string{m + "/cmd/agora"}}}, 1},
		{"stack imports agoratest", []pkg{{m + "/stack", []string{m + "/agoratest"}}}, 1},
		{"agoratest imports a harness", []pkg{{m + "/agoratest", []string{m + "/harness/systemtest"}}}, 1},
		{"pkg imports stack", []pkg{{m + "/pkg/client", []string{m + "/stack"}}}, 1},
		{"service imports another service", []pkg{{m + "/services/worker", []string{m + "/services/dispatcher"}}}, 1},
		{"service main imports another service", []pkg{{m + "/services/worker/cmd/worker", []string{m + "/services/worker", m + "/services/router/routes"}}}, 1},
		{"sentinel imports lifecycle", []pkg{{m + "/pkg/sentinel", []string{m + "/pkg/lifecycle"}}}, 1},
		{"sentinel imports internal", []pkg{{m + "/pkg/sentinel", []string{m + "/internal/config"}}}, 1},
		{"pkg imports a service", []pkg{{m + "/pkg/client", []string{m + "/services/dispatcher"}}}, 1},
		{"pkg imports an answerer", []pkg{{m + "/pkg/answerer", []string{m + "/answerers/inbox"}}}, 1},
		{"pkg imports cmd", []pkg{{m + "/pkg/lifecycle", []string{m + "/cmd/agora"}}}, 1},
		{"pkg imports internal", []pkg{{m + "/pkg/client", []string{m + "/internal/clip"}}}, 1},
		{"pkg imports pkg", []pkg{{m + "/pkg/answerlink", []string{m + "/pkg/seal", m + "/pkg/lifecycle"}}}, 0},
		{"launcher imports its own subpackage", []pkg{{m + "/internal/sandbox/launcher", []string{m + "/internal/sandbox/launcher/seccompgen", "golang.org/x/sys/unix"}}}, 0},
		{"sandbox imports the launcher", []pkg{{m + "/internal/sandbox", []string{m + "/internal/sandbox/launcher"}}}, 0},
		{"launcher imports the sandbox", []pkg{{m + "/internal/sandbox/launcher", []string{m + "/internal/sandbox"}}}, 1},
		{"launcher imports a runtime helper", []pkg{{m + "/internal/sandbox/launcher", []string{m + "/internal/clip"}}}, 1},
		{"launcher subpackage imports pkg", []pkg{{m + "/internal/sandbox/launcher/seccompgen", []string{m + "/pkg/subagent"}}}, 1},
		{"several at once", []pkg{
			{m + "/pkg/lifecycle", []string{m + "/cmd/agora", m + "/services/worker"}},
			{m + "/services/a", []string{m + "/services/b"}},
		}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := violations(m, tt.pkgs)
			if len(got) != tt.want {
				t.Errorf("violations = %q, want %d", got, tt.want)
			}
		})
	}
}

// moduleRoot returns the module path and its root directory.
func moduleRoot(t *testing.T) (module, dir string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Path}}\t{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", exitDetail(err))
	}
	module, dir, ok := strings.Cut(strings.TrimSpace(string(out)), "\t")
	if !ok || module == "" || dir == "" {
		t.Fatalf("go list -m printed %q", out)
	}
	return module, dir
}

func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return errors.New(err.Error() + ": " + string(ee.Stderr))
	}
	return err
}

// listPackages lists every package of the module with its dependencies.
// Packages that do not compile are still listed (-e): the rule is about
// imports, and a half-written package elsewhere must not hide a violation.
func listPackages(t *testing.T, dir string) []pkg {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-e", "-json=ImportPath,Deps", "./...")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", exitDetail(err))
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestImportDirection(t *testing.T) {
	module, dir := moduleRoot(t)
	pkgs := listPackages(t, dir)

	// The listing really covers the module.
	var paths []string
	for _, p := range pkgs {
		paths = append(paths, p.ImportPath)
	}
	for _, want := range []string{"pkg/lifecycle", "pkg/sentinel", "internal/archtest"} {
		if !slices.Contains(paths, module+"/"+filepath.ToSlash(want)) {
			t.Fatalf("go list in %s did not list %s/%s: %q", dir, module, want, paths)
		}
	}

	for _, v := range violations(module, pkgs) {
		t.Error(v)
	}
}

// goFile is the part of a Go file of the module the file rules read.
type goFile struct {
	Path    string // relative to the module's root, with slashes
	Imports []string
}

// checkPath is the package `agora subagent check` reaches the sandbox
// through: a file of cmd/ that imports it is on the check's path.
const checkPath = "internal/sandbox/contain"

// fileViolations applies the rules that hold for files rather than whole
// packages: a file of cmd/ on the check's path (one that imports
// checkPath) imports no service, so `agora subagent check` reads a
// definition without a service in its build graph's reasons.
func fileViolations(module string, files []goFile) []string {
	var out []string
	for _, f := range files {
		if !under(f.Path, "cmd") || !slices.Contains(f.Imports, module+"/"+checkPath) {
			continue
		}
		for _, imp := range f.Imports {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok && under(rel, "services") {
				out = append(out, f.Path+" imports "+imp+": a file of cmd/ that imports "+checkPath+" (the subagent check path) imports no service")
			}
		}
	}
	return out
}

func TestFileViolations(t *testing.T) {
	const m = "example.com/mod"
	tests := []struct {
		name  string
		files []goFile
		want  int
	}{
		{"check path without a service", []goFile{{"cmd/agora/subagents.go", []string{m + "/internal/sandbox/contain", m + "/pkg/subagent", "fmt"}}}, 0},
		{"another file of cmd imports a service", []goFile{{"cmd/agora/dev.go", []string{m + "/services/worker"}}}, 0},
		{"the worker imports contain", []goFile{{"services/worker/worker.go", []string{m + "/internal/sandbox/contain", m + "/services/worker/x"}}}, 0},
		{"check path imports the worker", []goFile{{"cmd/agora/subagents.go", []string{m + "/internal/sandbox/contain", m + "/services/worker"}}}, 1},
		{"check path imports two services", []goFile{{"cmd/agora/check.go", []string{m + "/services/dispatcher", m + "/internal/sandbox/contain", m + "/services/worker"}}}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fileViolations(m, tt.files); len(got) != tt.want {
				t.Errorf("fileViolations = %q, want %d", got, tt.want)
			}
		})
	}
}

// TestCheckPathImportsNoService: `agora subagent check` reaches
// CheckDefinition without importing a service.
func TestCheckPathImportsNoService(t *testing.T) {
	module, dir := moduleRoot(t)
	var files []goFile
	onPath := 0
	err := filepath.WalkDir(filepath.Join(dir, "cmd"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		gf := goFile{Path: filepath.ToSlash(rel)}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			gf.Imports = append(gf.Imports, p)
		}
		if slices.Contains(gf.Imports, module+"/"+checkPath) {
			onPath++
		}
		files = append(files, gf)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The rule still looks at the check: some file of cmd/ reaches it.
	if onPath == 0 {
		t.Fatalf("no file under cmd/ imports %s: the check's path moved, and this rule with it", checkPath)
	}
	for _, v := range fileViolations(module, files) {
		t.Error(v)
	}
}
