package archtest_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// Every relative link of the Markdown pages (docs/*.md, README.md, and
// every page under examples/ and deploy/) names a file that exists, and a
// link with a #fragment into a Markdown page names one of that page's
// headings as GitHub makes anchors of them. Every docs/x.md#anchor and
// docs/x.md §N a source file writes resolves the same way.
var (
	mdLink     = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	mdRef      = regexp.MustCompile(`(?m)^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+.*)?$`)
	mdHead     = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*#*\s*$`)
	htmlID     = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	codeSpan   = regexp.MustCompile("`[^`\n]*`")
	docAnchor  = regexp.MustCompile(`docs/([\w-]+\.md)#([\w-]+)`)
	docSection = regexp.MustCompile(`docs/([\w-]+\.md),?\s+§\s*(\d+(?:\.\d+)*)`)
	schemeLink = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// slug is the anchor GitHub gives a heading: its text without markup,
// lower case, every character that is not a letter, a digit, a space, a
// hyphen or an underscore dropped, and each space made a hyphen.
func slug(h string) string {
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1")
	h = strings.NewReplacer("`", "", "*", "").Replace(h)
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// page is a Markdown file's anchors and links, code blocks left out.
type page struct {
	anchors map[string]bool
	links   []string
}

func parsePage(src string) page {
	p := page{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")) {
			fence = trimmed[:3]
			continue
		}
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if m := mdHead.FindStringSubmatch(line); m != nil {
			s := slug(m[1])
			if n := seen[s]; n > 0 {
				p.anchors[s+"-"+itoa(n)] = true
			} else {
				p.anchors[s] = true
			}
			seen[s]++
		}
		for _, m := range htmlID.FindAllStringSubmatch(line, -1) {
			p.anchors[m[1]] = true
		}
		text := codeSpan.ReplaceAllString(line, "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			p.links = append(p.links, m[1])
		}
		for _, m := range mdRef.FindAllStringSubmatch(text, -1) {
			p.links = append(p.links, m[1])
		}
	}
	return p
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

// linkProblems checks each link of the page at file (a path under root)
// against the files under root and the anchors of the pages read so far.
func linkProblems(root, file string, links []string, anchorsOf func(string) (map[string]bool, bool)) []string {
	var out []string
	for _, l := range links {
		if schemeLink.MatchString(l) || strings.HasPrefix(l, "//") {
			continue
		}
		target, frag, _ := strings.Cut(l, "#")
		path := file
		if target != "" {
			path = filepath.Join(filepath.Dir(file), filepath.FromSlash(target))
			if strings.HasPrefix(target, "/") {
				path = filepath.Join(root, filepath.FromSlash(target))
			}
			if _, err := os.Stat(path); err != nil {
				out = append(out, rel(root, file)+": links to "+l+": no such file")
				continue
			}
		}
		if frag == "" || !strings.HasSuffix(path, ".md") {
			continue
		}
		anchors, ok := anchorsOf(path)
		if !ok {
			continue
		}
		if !anchors[strings.ToLower(frag)] {
			out = append(out, rel(root, file)+": links to "+l+": no such heading")
		}
	}
	return out
}

func rel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return filepath.ToSlash(r)
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Streams and buckets":                               "streams-and-buckets",
		"The event stream: `GET /v1/events`":                "the-event-stream-get-v1events",
		"Waiting questions (`agora bench --scale pending`)": "waiting-questions-agora-bench---scale-pending",
		"5. Sub-agent definition (KV `agora_subagents`)":    "5-sub-agent-definition-kv-agora_subagents",
		"What holds, reported":                              "what-holds-reported",
		"The operator's floor":                              "the-operators-floor",
		"Ask once — [more](x.md)":                           "ask-once--more",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}

func TestParsePage(t *testing.T) {
	p := parsePage("# A\n## A\n```\n# not\n[x](gone.md)\n```\n[y](b.md#c) `[z](nope.md)`\n[r]: ref.md\n")
	for _, a := range []string{"a", "a-1"} {
		if !p.anchors[a] {
			t.Errorf("anchor %q missing from %v", a, p.anchors)
		}
	}
	if p.anchors["not"] {
		t.Error("a heading in a code block made an anchor")
	}
	if !slices.Equal(p.links, []string{"b.md#c", "ref.md"}) {
		t.Errorf("links %q", p.links)
	}
}

// markdownPages lists the pages whose links are checked.
func markdownPages(t *testing.T, root string) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	for _, dir := range []string{"examples", "deploy"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				pages = append(pages, p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return pages
}

func TestMarkdownLinksResolve(t *testing.T) {
	_, root := moduleRoot(t)
	cache := map[string]page{}
	read := func(path string) (page, bool) {
		if p, ok := cache[path]; ok {
			return p, true
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return page{}, false
		}
		p := parsePage(string(b))
		cache[path] = p
		return p, true
	}
	anchorsOf := func(path string) (map[string]bool, bool) {
		p, ok := read(path)
		return p.anchors, ok
	}
	pages := markdownPages(t, root)
	if len(pages) < 20 {
		t.Fatalf("found only %d pages", len(pages))
	}
	links := 0
	for _, path := range pages {
		p, ok := read(path)
		if !ok {
			t.Fatalf("read %s", path)
		}
		links += len(p.links)
		for _, problem := range linkProblems(root, path, p.links, anchorsOf) {
			t.Error(problem)
		}
	}
	if links < 100 {
		t.Fatalf("found only %d links", links)
	}
}

// sourceDocProblems lists the docs/x.md#anchor and docs/x.md §N
// references in src whose page has no such heading.
func sourceDocProblems(file, src string, anchors map[string]map[string]bool) []string {
	var out []string
	for _, m := range docAnchor.FindAllStringSubmatch(src, -1) {
		a, ok := anchors[m[1]]
		if ok && !a[strings.ToLower(m[2])] {
			out = append(out, file+": cites docs/"+m[1]+"#"+m[2]+", a heading it does not have")
		}
	}
	for _, m := range docSection.FindAllStringSubmatch(src, -1) {
		a, ok := anchors[m[1]]
		if !ok {
			continue
		}
		num := strings.ReplaceAll(m[2], ".", "")
		if !slices.ContainsFunc(slices.Collect(mapKeys(a)), func(s string) bool { return strings.HasPrefix(s, num+"-") }) {
			out = append(out, file+": cites docs/"+m[1]+" §"+m[2]+", a section it does not number; cite the heading")
		}
	}
	return out
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestSourceDocProblems(t *testing.T) {
	anchors := map[string]map[string]bool{"wire.md": {"streams": true, "3-cloudevents": true}}
	for src, want := range map[string]int{
		"// docs/wire.md#streams":     0,
		"// docs/wire.md#buckets":     1,
		"// docs/gone.md#buckets":     0, // TestDocsCitationsResolve reports the page
		"// docs/wire.md §3":          0,
		"// docs/wire.md §3.5, ask":   1,
		"// (docs/wire.md, §2 \"x\")": 1,
	} {
		if got := sourceDocProblems("x.go", src, anchors); len(got) != want {
			t.Errorf("%q: %d problems %q, want %d", src, len(got), got, want)
		}
	}
}

// TestSourceDocReferencesResolve reads the module's Go, shell, YAML and
// configuration files for anchors and section numbers of docs pages, and
// the files other than Go (which TestDocsCitationsResolve reads) for the
// pages and headings they cite.
func TestSourceDocReferencesResolve(t *testing.T) {
	_, root := moduleRoot(t)
	mds, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	headings := map[string][]string{} // as TestDocsCitationsResolve reads them
	for _, p := range mds {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		anchors[filepath.Base(p)] = parsePage(string(b)).anchors
		for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
			headings[filepath.Base(p)] = append(headings[filepath.Base(p)], norm(m[1]+m[2]))
		}
	}
	exts := []string{".go", ".sh", ".yaml", ".yml", ".conf", ".tmpl", ".mk"}
	files := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		name := d.Name()
		if d.IsDir() || name == "links_test.go" || name == "citations_test.go" ||
			!(slices.Contains(exts, filepath.Ext(name)) || name == "Makefile" || name == "Dockerfile") {
			return nil // the tests' cases cite pages that are not there on purpose
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		for _, problem := range sourceDocProblems(rel(root, p), string(b), anchors) {
			t.Error(problem)
		}
		if filepath.Ext(name) != ".go" { // TestDocsCitationsResolve reads Go files
			for _, problem := range citationProblems(rel(root, p), strings.ReplaceAll(string(b), "#", "//"), headings) {
				t.Error(problem)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read only %d files", files)
	}
}
