package contain_test

import (
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/sandbox/contain"
	"github.com/agora-dispatch/agora/pkg/subagent"
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
			want: map[string]string{"{dir}/agent": contain.CheckOK, "{dir}/tools/interp": contain.CheckDenied, "/bin/sh": contain.CheckOK},
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
			want: map[string]string{"{dir}/agent": contain.CheckOK, "{dir}/tools/interp": contain.CheckOK},
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
			want: map[string]string{"{dir}/home/venv/bin/python": contain.CheckOK, "{dir}/home/.pyenv/versions/3.12/bin/python3": contain.CheckDenied},
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
			want:  map[string]string{"{dir}/tools/interp": contain.CheckOK},
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
			want: map[string]string{"{dir}/bin/tool": contain.CheckOK, "{dir}/a/link1": contain.CheckDenied, "{dir}/b/real": contain.CheckDenied, "/bin/sh": contain.CheckOK},
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
			want:  map[string]string{"/usr/bin/env": contain.CheckOK, "{dir}/bin/mytool": contain.CheckDenied},
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
			want: map[string]string{"$AGORA_WORKSPACE/run.sh": contain.CheckOK, "{dir}/bin/mytool": contain.CheckDenied},
			add:  []string{"{dir}/bin"},
		},
		{
			name: "an ELF program under /usr",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				return subagent.Definition{Name: "t", Runtime: "exec", Command: []string{"/bin/true"}}, nil
			},
			want: map[string]string{"/bin/true": contain.CheckOK},
		},
		{
			name: "a command not on PATH is missing, not denied",
			setup: func(t *testing.T, dir string) (subagent.Definition, []string) {
				return subagent.Definition{Name: "m", Runtime: "exec", Command: []string{"no-such-tool-here"}}, []string{"PATH=" + dir}
			},
			want: map[string]string{"no-such-tool-here": contain.CheckMissing},
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
			want: map[string]string{"{dir}/bin/interp": contain.CheckOK, "{etc}": contain.CheckDenied},
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
			want: map[string]string{"{etc}": contain.CheckOK},
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
			want: map[string]string{"{dir}/home/.mytool/versions/1.2/bin/interp": contain.CheckDenied},
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
				"{dir}/home/.pyenv/shims/python3":                  contain.CheckOK, // the worker binds the command itself
				"{dir}/home/.pyenv/libexec/pyenv":                  contain.CheckDenied,
				"{dir}/home/.pyenv/versions/3.12.1/bin/python3":    contain.CheckDenied,
				"{dir}/home/.pyenv/versions/3.12.1/bin/python3.12": contain.CheckDenied,
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
			want: map[string]string{"{dir}/claude/cli.js": contain.CheckOK, "{dir}/node/bin/node": contain.CheckDenied},
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
			rep := contain.CheckDefinition(def, env)
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
	rep := contain.CheckDefinition(subagent.Definition{Name: "t", Runtime: "exec", Command: []string{"/bin/true"}}, nil)
	i := slices.IndexFunc(rep.Steps, func(s contain.CheckStep) bool { return s.Why == "ELF interpreter of /bin/true" })
	if i < 0 {
		t.Fatalf("no ELF interpreter step: %+v", rep.Steps)
	}
	if rep.Steps[i].Status != contain.CheckOK || rep.Denied() {
		t.Errorf("the loader is not shown: %+v", rep.Steps)
	}
}

// TestCheckCLIRuntimes: agora subagent check follows each CLI runtime's
// executable, named by its worker variable or found on PATH, to the
// interpreter its #! line looks up. The worker shows codex itself
// wherever it is; gemini-cli's command is env(1), which the worker
// shows, so gemini's own folder must be in read_paths.
func TestCheckCLIRuntimes(t *testing.T) {
	for _, c := range []struct {
		runtime, bin, variable string
		viaEnv                 bool
	}{
		{subagent.RuntimeCodex, "codex", "AGORA_WORKER_CODEX_BIN", false},
		{subagent.RuntimeGeminiCLI, "gemini", "AGORA_WORKER_GEMINI_BIN", true},
	} {
		for _, named := range []bool{true, false} {
			name := c.runtime + " on PATH"
			if named {
				name = c.runtime + " named by " + c.variable
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				checkTree(t, dir, map[string]string{"node/bin/node": "#!/bin/sh\n", "cli/bin/" + c.bin: "#!/usr/bin/env node\n"})
				cli := filepath.Join(dir, "cli/bin", c.bin)
				path := "PATH=" + filepath.Join(dir, "node/bin") + ":/usr/bin:/bin"
				env, why := []string{path, c.variable + "=" + cli}, "the "+c.runtime+" runtime's CLI ("+c.variable+")"
				if !named {
					env, why = []string{path + ":" + filepath.Dir(cli)}, "the "+c.runtime+" runtime's CLI (via PATH)"
				}
				rep := contain.CheckDefinition(subagent.Definition{Name: "c", Runtime: c.runtime, Prompt: "hi"}, env)
				steps := map[string]contain.CheckStep{}
				for _, s := range rep.Steps {
					steps[s.Path] = s
				}
				status, add := contain.CheckOK, []string{filepath.Join(dir, "node/bin")}
				if c.viaEnv {
					status, add = contain.CheckDenied, []string{filepath.Dir(cli), filepath.Join(dir, "node/bin")}
					if s := steps["/usr/bin/env"]; s.Status != contain.CheckOK || !strings.HasPrefix(s.Why, "env, which runs") {
						t.Errorf("/usr/bin/env: %+v, want ok, the command", s)
					}
				}
				if s := steps[cli]; s.Status != status || !strings.HasPrefix(s.Why, why) {
					t.Errorf("%s: %+v, want %s, why %q", cli, s, status, why)
				}
				if s := steps[filepath.Join(dir, "node/bin/node")]; s.Status != contain.CheckDenied {
					t.Errorf("node: %+v, want denied", s)
				}
				if !slices.Equal(rep.Add, add) {
					t.Errorf("add_read_paths %q, want %q", rep.Add, add)
				}
			})
		}
	}
}
