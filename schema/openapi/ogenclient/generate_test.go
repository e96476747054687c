package ogenclient_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The committed client is what ogen (the go.mod tool) generates from the
// repository's document with ogen.yml: generation must succeed, and its
// files must equal the committed ones (run go generate
// ./schema/openapi/ogenclient after changing the document).
func TestGeneratedClientIsCurrent(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run the tool: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), goBin, "tool", "ogen", "-config", "ogen.yml", "-target", dir, "-package", "ogenclient", "-clean", "../agora.json")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ogen: %v\n%s", err, out)
	}
	generated, _ := filepath.Glob(filepath.Join(dir, "oas_*_gen.go"))
	committed, _ := filepath.Glob("oas_*_gen.go")
	names := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		slices.Sort(out)
		return out
	}
	if g, c := names(generated), names(committed); !slices.Equal(g, c) {
		t.Fatalf("ogen writes %v, the package holds %v: run go generate ./schema/openapi/ogenclient", g, c)
	}
	for _, p := range generated {
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Base(p))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not what ogen generates now (%v): run go generate ./schema/openapi/ogenclient", filepath.Base(p), err)
		}
	}
	if len(generated) == 0 || !strings.HasSuffix(generated[0], "_gen.go") {
		t.Fatal("ogen wrote no client")
	}
}
