package archtest_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A comment that cites a docs page by a heading, as `(docs/worker.md,
// "Workspaces")`, names a page of docs/ and a heading of it (or the bold
// label that opens a paragraph, `**No privilege.**`): a reader who follows
// it finds the place. Wrapped comment lines are joined before matching.
var (
	citation = regexp.MustCompile(`docs/([\w-]+\.md)(?:,\s*(?://\s*)?|\s+(?://\s*)?)"([^"]+)"`)
	docLink  = regexp.MustCompile(`docs/([\w-]+\.md)`)
	heading  = regexp.MustCompile(`(?m)^#+\s+(.+)$|\*\*([^*]+?)\.?\*\*`)
)

// norm is a heading or a cited name as compared: no backticks, one space
// between words, no comment markers of a wrapped line, lower case.
func norm(s string) string {
	s = strings.ReplaceAll(s, "`", "")
	s = strings.ReplaceAll(s, "//", " ")
	return strings.ToLower(strings.Join(strings.Fields(s), " "))
}

// citationProblems lists the citations in src (a Go file's text) whose
// page is not in pages or whose heading is not one of that page's.
func citationProblems(file, src string, pages map[string][]string) []string {
	var out []string
	for _, m := range docLink.FindAllStringSubmatch(src, -1) {
		if _, ok := pages[m[1]]; !ok {
			out = append(out, file+": cites docs/"+m[1]+", which does not exist")
		}
	}
	for _, m := range citation.FindAllStringSubmatch(src, -1) {
		hs, ok := pages[m[1]]
		if !ok {
			continue
		}
		want := norm(m[2])
		if !slices.ContainsFunc(hs, func(h string) bool { return strings.HasPrefix(h, want) }) {
			out = append(out, file+": cites docs/"+m[1]+", \""+m[2]+"\", a heading it does not have")
		}
	}
	return out
}

func TestCitationProblems(t *testing.T) {
	pages := map[string][]string{"worker.md": {"workspaces", "why a sweep never touches a live run", "no privilege"}}
	cases := []struct {
		src  string
		want int
	}{
		{`// see (docs/worker.md, "Workspaces").`, 0},
		{"// never (docs/worker.md, \"Why a sweep never\n// touches a live run\").", 0},
		{`// (docs/worker.md, "No privilege")`, 0},
		{`// (docs/worker.md, "Sweeps")`, 1},
		{`// (docs/gone.md, "Sweeps")`, 1},
		{`// docs/gone.md says`, 1},
	}
	for _, tc := range cases {
		if got := citationProblems("x.go", tc.src, pages); len(got) != tc.want {
			t.Errorf("%q: %d problems %q, want %d", tc.src, len(got), got, tc.want)
		}
	}
}

// TestDocsCitationsResolve reads every Go file of the module.
func TestDocsCitationsResolve(t *testing.T) {
	_, dir := moduleRoot(t)
	pages := map[string][]string{}
	mds, err := filepath.Glob(filepath.Join(dir, "docs", "*.md"))
	if err != nil || len(mds) == 0 {
		t.Fatalf("docs pages: %v (%d found)", err, len(mds))
	}
	for _, p := range mds {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var hs []string
		for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
			hs = append(hs, norm(m[1]+m[2]))
		}
		pages[filepath.Base(p)] = hs
	}
	var problems []string
	files := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || d.Name() == "citations_test.go" || d.Name() == "links_test.go" {
			return nil // these files' cases cite pages that are not there on purpose
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		rel, _ := filepath.Rel(dir, p)
		problems = append(problems, citationProblems(rel, string(b), pages)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read only %d Go files", files)
	}
	for _, p := range problems {
		t.Error(p)
	}
}
