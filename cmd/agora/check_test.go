package main_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSubagentCheck: `agora subagent check -f` prints each path the
// command needs with whether the run sees it and the read_paths line to
// add, exits 6 when something would be denied and 0 once the line is
// added; apply warns the same way and stores the definition anyway, and
// `check NAME` reads the stored one.
func TestSubagentCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tools := filepath.Join(dir, "tools")
	if err := os.Mkdir(tools, 0o755); err != nil {
		t.Fatal(err)
	}
	interp := filepath.Join(tools, "interp")
	agent := filepath.Join(dir, "agent")
	for p, content := range map[string]string{interp: "#!/bin/sh\nexec cat \"$1\"\n", agent: "#!" + interp + "\nhello\n"} {
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	def := "name: checked\nruntime: exec\ncommand: [" + agent + "]\n"
	env := append(cleanEnv(), "PATH=/usr/bin:/bin")

	r := agoraWith(t, env, "subagent", "check", "-f", writeFile(t, "checked.yaml", def))
	if r.code != 6 {
		t.Fatalf("check of a definition whose interpreter is not shown: want exit 6\n%s", r)
	}
	for _, re := range []string{
		`^checked \(runtime exec, sandbox standard\):\n`,
		`(?m)^  ok +` + regexp.QuoteMeta(agent) + ` +command$`,
		`(?m)^  denied +` + regexp.QuoteMeta(interp) + ` +interpreter of ` + regexp.QuoteMeta(agent) + ` \(#!` + regexp.QuoteMeta(interp) + `\)$`,
		`(?m)^add to the definition:\n  sandbox:\n    read_paths: \[` + regexp.QuoteMeta(tools) + `\]\n`,
		`(?m)^checked on this host with PATH=/usr/bin:/bin; `,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("stdout does not match %s:\n%s", re, r.stdout)
		}
	}

	fixed := def + "sandbox:\n  read_paths: [" + tools + "]\n"
	r = agoraWith(t, env, "subagent", "check", "-f", writeFile(t, "fixed.yaml", fixed))
	if r.code != 0 || !strings.Contains(r.stdout, "the run sees every path its command needs.") || strings.Contains(r.stdout, "denied") {
		t.Errorf("check with the suggested read_paths: want exit 0 and nothing denied\n%s", r)
	}

	r = agoraWith(t, env, "subagent", "check", "--json", "-f", writeFile(t, "checked.json", def))
	lines := jsonLines(t, r.stdout)
	if r.code != 6 || len(lines) != 1 {
		t.Fatalf("check --json: want exit 6 and one line\n%s", r)
	}
	if add, _ := lines[0]["add_read_paths"].([]any); len(add) != 1 || add[0] != tools {
		t.Errorf("check --json add_read_paths = %v, want [%s]", lines[0]["add_read_paths"], tools)
	}

	// apply warns on stderr and stores the definition all the same.
	r = agoraWith(t, append(agoraEnv(t), "PATH=/usr/bin:/bin"), "subagent", "apply", "-f", writeFile(t, "checked.yaml", def))
	if r.code != 0 || !strings.Contains(r.stdout, "sub-agent checked ") {
		t.Fatalf("apply of a definition with a denied interpreter: want it stored\n%s", r)
	}
	for _, want := range []string{"warning: sub-agent checked: its sandbox would deny 1 path(s)", "denied  " + interp, "read_paths: [" + tools + "]"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("apply's stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	r = agoraWith(t, append(agoraEnv(t), "PATH=/usr/bin:/bin"), "subagent", "check", "checked")
	if r.code != 6 || !strings.Contains(r.stdout, "denied  "+interp) {
		t.Errorf("check of the stored definition: want exit 6 naming %s\n%s", interp, r)
	}
	if r := agora(t, "subagent", "check", "nobody-here"); r.code != 1 || !strings.Contains(r.stderr, "no sub-agent nobody-here") {
		t.Errorf("check of an unknown name: %s", r)
	}
}
