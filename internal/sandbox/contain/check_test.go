package worker_test

import (
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// checkTree lays files out under dir: each entry is a path relative to
// dir and its content; "-> target" makes a symbolic link instead. Every
// file is executable.
func checkTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "-> "); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// etcFileOutsideStrict is a file of this host's /etc that the strict
// mode does not show.
func etcFileOutsideStrict(t *testing.T) string {
	for _, p := range []string{"/etc/shells", "/etc/hostname", "/etc/profile", "/etc/issue", "/etc/environment", "/etc/debian_version"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	t.Skip("no file of /etc outside the strict mode's list on this host")
	return ""
}

func TestCheckDefinition(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/env"); err != nil {
		t.Skip("no /usr/bin/env on this host")
	}
	cases := []struct {
		name string
		// setup lays out files under dir and returns the definition and
		// the environment to check it with.
		setup func(t *testing.T, dir string) (subagent.Definition, []string)
		// want is the status of each path the report must hold ({dir}
		// stands for the test's folder).
		want map[string]string
		// add is the read_paths entries the report suggests, in order.
		add []string
		// notes must each be part of some note.
		notes []string
		// etc: {etc} in want and add stands for etcFileOutsideStrict.
		etc bool
	}{
		{
			name: "script whose interpreter is not shown",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{
					"tools/interp": "#!/bin/sh\nexec cat \"$1\"\n",
					"agent":        "#!" + filepath.Join(dir, "tools/interp") + "\nhello\n",
				})
				return subagent.Definition{Name: "s", Runtime: "exec", Command: []string{filepath.Join(dir, "agent")}}, []string{"PATH=/usr/bin:/bin"}
			},
			want: map[string]string{"{dir}/agent": worker.CheckOK, "{dir}/tools/interp": worker.CheckDenied, "/bin/sh": worker.CheckOK},
			add:  []string{"{dir}/tools"},
		},
		{
			name: "the same with the interpreter's folder in read_paths",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{
					"tools/interp": "#!/bin/sh\nexec cat \"$1\"\n",
					"agent":        "#!" + filepath.Join(dir, "tools/interp") + "\nhello\n",
				})
				d := subagent.Definition{Name: "s", Runtime: "exec", Command: []string{filepath.Join(dir, "agent")}}
				d.Sandbox.ReadPaths = []string{filepath.Join(dir, "tools")}
				return d, []string{"PATH=/usr/bin:/bin"}
			},
			want: map[string]string{"{dir}/agent": worker.CheckOK, "{dir}/tools/interp": worker.CheckOK},
		},
		{
			name: "a command under read_paths that links into a hidden folder",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{
					"home/.pyenv/versions/3.12/bin/python3": "#!/bin/sh\n",
					"home/venv/bin/python":                  "-> " + filepath.Join(dir, "home/.pyenv/versions/3.12/bin/python3"),
				})
				d := subagent.Definition{Name: "s", Runtime: "exec", Command: []string{filepath.Join(dir, "home/venv/bin/python")}}
				d.Sandbox.ReadPaths = []string{filepath.Join(dir, "home/venv/bin")}
				return d, []string{"PATH=/usr/bin:/bin"}
			},
			// The folder bind shows the link as a link: its target's
			// folder is what to add, not the link's.
			want: map[string]string{"{dir}/home/venv/bin/python": worker.CheckOK, "{dir}/home/.pyenv/versions/3.12/bin/python3": worker.CheckDenied},
			add:  []string{"{dir}/home/.pyenv/versions/3.12/bin"},
		},
		{
			name: "mode off sees everything",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{
					"tools/interp": "#!/bin/sh\n",
					"agent":        "#!" + filepath.Join(dir, "tools/interp") + "\n",
				})
				d := subagent.Definition{Name: "s", Runtime: "exec", Command: []string{filepath.Join(dir, "agent")}}
				d.Sandbox.Mode = subagent.SandboxOff
				return d, []string{"PATH=/usr/bin:/bin"}
			},
			want:  map[string]string{"{dir}/tools/interp": worker.CheckOK},
			notes: []string{"mode off"},
		},
		{
			name: "a chain of symbolic links below a read path",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{
					"bin/tool":  "-> " + filepath.Join(dir, "a/link1"),
					"a/link1":   "-> ../b/real",
					"b/real":    "#!/bin/sh\n",
					"bin/other": "#!/bin/sh\n",
				})
				d := subagent.Definition{Name: "l", Runtime: "exec", Command: []string{"tool"}}
				d.Sandbox.ReadPaths = []string{filepath.Join(dir, "bin")}
				return d, []string{"PATH=" + filepath.Join(dir, "bin") + ":/usr/bin:/bin"}
			},
			want: map[string]string{"{dir}/bin/tool": worker.CheckOK, "{dir}/a/link1": worker.CheckDenied, "{dir}/b/real": worker.CheckDenied, "/bin/sh": worker.CheckOK},
			add:  []string{"{dir}/a", "{dir}/b"},
		},
		{
			name: "#!/usr/bin/env resolves the program on PATH",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{
					"bin/mytool": "#!/bin/sh\n",
					"agent":      "#!/usr/bin/env -S mytool -x\n",
				})
				return subagent.Definition{Name: "e", Runtime: "exec", Command: []string{filepath.Join(dir, "agent")}},
					[]string{"PATH=" + filepath.Join(dir, "bin") + ":/usr/bin:/bin"}
			},
			want:  map[string]string{"/usr/bin/env": worker.CheckOK, "{dir}/bin/mytool": worker.CheckDenied},
			add:   []string{"{dir}/bin"},
			notes: []string{"finds no mytool"},
		},
		{
			name: "a script the definition's files lay down",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{"bin/mytool": "#!/bin/sh\n"})
				return subagent.Definition{Name: "w", Runtime: "exec", Command: []string{"./run.sh"}, Files: map[string]string{"run.sh": "#!/usr/bin/env mytool\n"}},
					[]string{"PATH=" + filepath.Join(dir, "bin") + ":/usr/bin:/bin"}
			},
			want: map[string]string{"$AGORA_WORKSPACE/run.sh": worker.CheckOK, "{dir}/bin/mytool": worker.CheckDenied},
			add:  []string{"{dir}/bin"},
		},
		{
			name: "an ELF program under /usr",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				return subagent.Definition{Name: "t", Runtime: "exec", Command: []string{"/bin/true"}}, nil
			},
			want: map[string]string{"/bin/true": worker.CheckOK},
		},
		{
			name: "a command not on PATH is missing, not denied",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				return subagent.Definition{Name: "m", Runtime: "exec", Command: []string{"no-such-tool-here"}}, []string{"PATH=" + dir}
			},
			want: map[string]string{"no-such-tool-here": worker.CheckMissing},
		},
		{
			name: "strict mode shows only some files of /etc",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{"bin/interp": "-> " + etcFileOutsideStrict(t), "agent": "#!" + filepath.Join(dir, "bin/interp") + "\n"})
				d := subagent.Definition{Name: "x", Runtime: "exec", Command: []string{filepath.Join(dir, "agent")}}
				d.Sandbox.Mode = subagent.SandboxStrict
				d.Sandbox.ReadPaths = []string{filepath.Join(dir, "bin")}
				return d, nil
			},
			want: map[string]string{"{dir}/bin/interp": worker.CheckOK, "{etc}": worker.CheckDenied},
			add:  []string{"{etc}"},
			etc:  true,
		},
		{
			name: "standard mode shows /etc",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{"bin/interp": "-> " + etcFileOutsideStrict(t), "agent": "#!" + filepath.Join(dir, "bin/interp") + "\n"})
				d := subagent.Definition{Name: "x", Runtime: "exec", Command: []string{filepath.Join(dir, "agent")}}
				d.Sandbox.ReadPaths = []string{filepath.Join(dir, "bin")}
				return d, nil
			},
			want: map[string]string{"{etc}": worker.CheckOK},
			etc:  true,
		},
		{
			name: "a tool under the home folder: its root",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{
					"home/.mytool/versions/1.2/bin/interp": "#!/bin/sh\n",
					"agent":                                "#!" + filepath.Join(dir, "home/.mytool/versions/1.2/bin/interp") + "\n",
				})
				return subagent.Definition{Name: "h", Runtime: "exec", Command: []string{filepath.Join(dir, "agent")}},
					[]string{"PATH=/usr/bin:/bin", "HOME=" + filepath.Join(dir, "home")}
			},
			want: map[string]string{"{dir}/home/.mytool/versions/1.2/bin/interp": worker.CheckDenied},
			add:  []string{"{dir}/home/.mytool"},
		},
		{
			name: "a pyenv shim runs pyenv and the selected version",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				root := filepath.Join(dir, "home/.pyenv")
				checkTree(t, dir, map[string]string{
					"home/.pyenv/shims/python3": "#!/usr/bin/env bash\nset -e\nprogram=\"${0##*/}\"\n\nexport PYENV_ROOT=\"" + root + "\"\n" +
						"exec \"" + root + "/libexec/pyenv\" exec \"$program\" \"$@\"\n",
					"home/.pyenv/libexec/pyenv":                  "#!/bin/sh\n",
					"home/.pyenv/version":                        "3.12.1\n",
					"home/.pyenv/versions/3.12.1/bin/python3":    "-> python3.12",
					"home/.pyenv/versions/3.12.1/bin/python3.12": "#!/bin/sh\n",
				})
				return subagent.Definition{Name: "p", Runtime: "exec", Command: []string{"python3", "agent.py"}},
					[]string{"PATH=" + filepath.Join(root, "shims") + ":/usr/bin:/bin", "HOME=" + filepath.Join(dir, "home")}
			},
			want: map[string]string{
				"{dir}/home/.pyenv/shims/python3":                  worker.CheckOK, // the worker binds the command itself
				"{dir}/home/.pyenv/libexec/pyenv":                  worker.CheckDenied,
				"{dir}/home/.pyenv/versions/3.12.1/bin/python3":    worker.CheckDenied,
				"{dir}/home/.pyenv/versions/3.12.1/bin/python3.12": worker.CheckDenied,
			},
			add:   []string{"{dir}/home/.pyenv"},
			notes: []string{"pyenv shim"},
		},
		{
			name: "claude-code checks the claude CLI",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				checkTree(t, dir, map[string]string{
					"node/bin/node": "#!/bin/sh\n",
					"claude/cli.js": "#!/usr/bin/env node\n",
				})
				return subagent.Definition{Name: "c", Runtime: subagent.RuntimeClaudeCode, Prompt: "hi"},
					[]string{"PATH=" + filepath.Join(dir, "node/bin") + ":/usr/bin:/bin", "AGORA_WORKER_CLAUDE_BIN=" + filepath.Join(dir, "claude/cli.js")}
			},
			want: map[string]string{"{dir}/claude/cli.js": worker.CheckOK, "{dir}/node/bin/node": worker.CheckDenied},
			add:  []string{"{dir}/node/bin"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			def, env := tc.setup(t, dir)
			etc := ""
			if tc.etc {
				etc = etcFileOutsideStrict(t)
			}
			expand := func(s string) string { return strings.NewReplacer("{dir}", dir, "{etc}", etc).Replace(s) }
			rep := worker.CheckDefinition(def, env)
			got := map[string]string{}
			for _, s := range rep.Steps {
				got[s.Path] = s.Status
			}
			for p, want := range tc.want {
				if got[expand(p)] != want {
					t.Errorf("%s: status %q, want %q", expand(p), got[expand(p)], want)
				}
			}
			var add []string
			for _, a := range tc.add {
				add = append(add, expand(a))
			}
			if !slices.Equal(rep.Add, add) {
				t.Errorf("add_read_paths = %v, want %v", rep.Add, add)
			}
			if rep.Denied() != (len(tc.add) > 0) {
				t.Errorf("Denied() = %v with add %v", rep.Denied(), tc.add)
			}
			if len(add) > 0 && !slices.Equal(rep.ReadPaths, append(slices.Clone(def.Sandbox.ReadPaths), add...)) {
				t.Errorf("read_paths = %v, want the definition's %v and %v", rep.ReadPaths, def.Sandbox.ReadPaths, add)
			}
			for _, n := range tc.notes {
				if !slices.ContainsFunc(rep.Notes, func(s string) bool { return strings.Contains(s, n) }) {
					t.Errorf("no note says %q: %q", n, rep.Notes)
				}
			}
			if t.Failed() {
				for _, s := range rep.Steps {
					t.Logf("%-7s %s  %s", s.Status, s.Path, s.Why)
				}
			}
		})
	}
}

// TestCheckDefinitionELFInterpreter: an ELF program's loader is one of
// the steps, and shown.
func TestCheckDefinitionELFInterpreter(t *testing.T) {
	t.Parallel()
	f, err := elf.Open("/bin/true")
	if err != nil {
		t.Skipf("no ELF /bin/true here: %v", err)
	}
	dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
	f.Close()
	if !dynamic {
		t.Skip("/bin/true is static here")
	}
	rep := worker.CheckDefinition(subagent.Definition{Name: "t", Runtime: "exec", Command: []string{"/bin/true"}}, nil)
	i := slices.IndexFunc(rep.Steps, func(s worker.CheckStep) bool { return s.Why == "ELF interpreter of /bin/true" })
	if i < 0 {
		t.Fatalf("no ELF interpreter step: %+v", rep.Steps)
	}
	if rep.Steps[i].Status != worker.CheckOK || rep.Denied() {
		t.Errorf("the loader is not shown: %+v", rep.Steps)
	}
}
