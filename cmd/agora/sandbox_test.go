package main_test

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReadmeShellSubagentUnderTheDefaultSandbox runs the README's shell
// sub-agent (agora needs-input from a script) with no sandbox block at all,
// under agora dev as the tests run it (root in CI): the run finds the agora
// helper on its PATH inside its own root and namespaces, and the question
// reaches the waiting client.
func TestReadmeShellSubagentUnderTheDefaultSandbox(t *testing.T) {
	t.Parallel()
	d := devServer(t)
	_, health := d.healthz(t)
	if !strings.Contains(string(health), `"isolation":"namespaces"`) {
		t.Fatalf("agora dev's worker does not give runs namespaces of their own: /healthz %s", health)
	}
	def := writeFile(t, "deployer.yaml", `name: readme-deployer
runtime: exec
command:
  - sh
  - -c
  - |
    agora needs-input --question "Deploy to staging or production?" --option staging --option production \
      --kind decision --partial-state '{"checked": ["migrations apply cleanly"]}' && exit 0
`)
	mustAgora(t, "subagent", "apply", "-f", def)
	wait := start(t, "dispatch", "readme-deployer", "--input", `{}`, "--wait")
	re := regexp.MustCompile(`agora answer (q-\S+) staging(?: --shown sha256:[0-9a-f]{64})?$`)
	line := wait.waitLine(t, 30*time.Second, re.MatchString)
	out := wait.stdout.String()
	for _, want := range []string{"Deploy to staging or production?", "Options: staging, production"} {
		if !strings.Contains(out, want) {
			t.Errorf("the question block lacks %q:\n%s", want, out)
		}
	}
	qid := re.FindStringSubmatch(line)[1]
	mustAgora(t, "answer", qid, "production")
}

// TestVersion: agora version prints the build's one version
// (internal/buildinfo): the release in development and the revision.
func TestVersion(t *testing.T) {
	t.Parallel()
	r := mustAgora(t, "version")
	if !regexp.MustCompile(`^agora 0\.3\.0-dev(\+[0-9a-f]{12}(\.dirty)?)?\n$`).MatchString(r.stdout + r.stderr) {
		t.Errorf("agora version: %q", r.stdout+r.stderr)
	}
	j := jsonLines(t, mustAgora(t, "version", "--json").stdout)
	if len(j) != 1 || j[0]["version"] != strings.TrimSpace(strings.TrimPrefix(r.stdout+r.stderr, "agora ")) || j[0]["release"] != "0.3.0" ||
		!strings.HasPrefix(j[0]["go"].(string), "go") || !strings.Contains(j[0]["os_arch"].(string), "/") {
		t.Errorf("agora version --json: %v", j)
	}
}
