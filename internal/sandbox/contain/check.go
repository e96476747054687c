package contain

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Checking a definition (docs/sandbox.md, "Checking a definition"): what
// a run of it executes — the command, each symbolic link on the way, the
// interpreter a script's #! line names, what a shim runs, an ELF
// program's loader and the libraries its RUNPATH names — and whether the
// run's root shows each of them.

// Statuses of a CheckStep.
const (
	CheckOK      = "ok"      // the run sees the path
	CheckDenied  = "denied"  // the run's root does not show the path
	CheckMissing = "missing" // the path does not exist on this host
)

// checkDepth bounds the chain of interpreters and shims one command may
// go through; checkLinks bounds the symbolic links followed in all.
const (
	checkDepth = 8
	checkLinks = 40
)

// CheckReport is what CheckDefinition found for one definition.
type CheckReport struct {
	Name    string `json:"name"`
	Runtime string `json:"runtime"`
	Mode    string `json:"mode"`
	// PATH is the sub-agent's PATH the command and #!/usr/bin/env lines
	// were resolved with (the run's own starts with the agora helper's
	// folder).
	PATH  string      `json:"path"`
	Steps []CheckStep `json:"steps"`
	// Add lists the read_paths entries that would show every denied
	// step; ReadPaths is the definition's read_paths with them added, the
	// list to write (empty when nothing is to be added).
	Add       []string `json:"add_read_paths,omitempty"`
	ReadPaths []string `json:"read_paths,omitempty"`
	Notes     []string `json:"notes,omitempty"`
}

// CheckStep is one path a run of the definition needs.
type CheckStep struct {
	Path string `json:"path"`
	// Why the run needs it: "command (via PATH)", "interpreter of X
	// (#!…)", "symlink target of X", "ELF interpreter of X", …
	Why    string `json:"why"`
	Status string `json:"status"` // CheckOK, CheckDenied or CheckMissing
	// Suggest is the read_paths entry that would show a denied path.
	Suggest string `json:"suggest,omitempty"`
}

// Denied reports whether some step is denied.
func (r CheckReport) Denied() bool {
	return slices.ContainsFunc(r.Steps, func(s CheckStep) bool { return s.Status == CheckDenied })
}

// Missing reports whether some step names a path this host lacks.
func (r CheckReport) Missing() bool {
	return slices.ContainsFunc(r.Steps, func(s CheckStep) bool { return s.Status == CheckMissing })
}

// CheckDefinition resolves what a run of def executes and reports, for
// each path, whether the run's root shows it, with the read_paths entries
// that would show the ones it does not. env is the environment the worker
// runs with, as os.Environ returns it; the sub-agent's PATH is taken from
// it as the worker passes it on (DefaultPath when it has none), and a CLI
// runtime's executable from its variable (runtimes.Spec.BinVar:
// AGORA_WORKER_CLAUDE_BIN, default claude on PATH, and the codex and
// gemini ones). It reads this
// host's filesystem and runs nothing; a worker on another host, or with
// another PATH, may resolve the command differently.
func CheckDefinition(def subagent.Definition, env []string) CheckReport {
	c := &checker{
		def:  def,
		mode: def.Sandbox.ModeOrDefault(),
		seen: map[string]bool{},
	}
	vars := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		vars[k] = v
		switch {
		case k == "PATH" && ok:
			c.path = v
		case k == "HOME":
			c.home = v
		case k == "PYENV_VERSION":
			c.pyenvVersion = v
		}
	}
	c.path = subagentPath(c.path)
	c.roots = c.shownRoots()
	c.rep = CheckReport{Name: def.Name, Runtime: def.Runtime, Mode: c.mode, PATH: c.path, Steps: []CheckStep{}}
	if c.mode == subagent.SandboxOff {
		c.note("mode off: the run sees the worker's whole filesystem")
	}
	var cfg runtimes.Config
	_ = cfg.LoadEnv(func(k string) (string, bool) { v, ok := vars[k]; return v, ok }) // it reports no error
	spec, ok := runtimes.Lookup(def.Runtime)
	switch rt := runtimes.Builtin(cfg)[def.Runtime]; {
	case def.Runtime == subagent.RuntimeExec || !ok:
		if !ok {
			c.note("runtime %q is not built in: its command is checked as the definition's", def.Runtime)
		}
		if len(def.Command) == 0 || def.Command[0] == "" {
			c.note("the definition has no command")
			break
		}
		c.command(def.Command[0], "command", true)
		for _, a := range def.Command[1:] {
			if filepath.IsAbs(a) {
				c.check(filepath.Clean(a), "named in command", 0, false)
			}
		}
	default:
		// What the runtime would run, with no input and no helper files.
		cmd, err := rt.Command(runtime.Invocation{Definition: def, Input: map[string]json.RawMessage{}, Helper: runtime.Helper{Disabled: true}})
		if err != nil || len(cmd.Args) == 0 {
			c.note("the %s runtime makes no command of this definition: %v", def.Runtime, err)
			break
		}
		why := fmt.Sprintf("the %s runtime's CLI", def.Runtime)
		if name := spec.BinVar(); name != "" && vars[name] != "" {
			why += " (" + name + ")"
		}
		args := cmd.Args
		if path.Base(args[0]) == "env" {
			// env(1) setting variables for the CLI, which it runs.
			c.command(args[0], fmt.Sprintf("env, which runs the %s runtime's CLI", def.Runtime), true)
			for len(args) > 1 && strings.Contains(args[1], "=") {
				args = args[1:]
			}
			args = args[1:]
		}
		if len(args) > 0 {
			c.command(args[0], why, len(args) == len(cmd.Args))
		}
	}
	c.suggest()
	return c.rep
}

// checker walks one definition's chain.
type checker struct {
	def          subagent.Definition
	mode         string
	path         string // the sub-agent's PATH
	home         string
	pyenvVersion string
	roots        []string // what the run's root shows, each with all beneath it
	alone        string   // the command's executable, shown on its own
	seen         map[string]bool
	links        int
	rep          CheckReport
}

func (c *checker) note(format string, a ...any) {
	n := fmt.Sprintf(format, a...)
	if !slices.Contains(c.rep.Notes, n) {
		c.rep.Notes = append(c.rep.Notes, n)
	}
}

// shownRoots are the paths the run's root shows besides the command's
// executable (policy.go, Prepare and namespacePolicy): the system
// folders, /etc or the strict mode's files of it, read_paths,
// write_paths, absolute paths the command names, the agora helper, and
// what the launcher makes itself.
func (c *checker) shownRoots() []string {
	sb := c.def.Sandbox
	roots := slices.Clone(systemDirs)
	if c.mode == subagent.SandboxStrict {
		roots = append(roots, strictEtc...)
	} else {
		roots = append(roots, "/etc")
	}
	roots = append(roots, sb.ReadPaths...)
	roots = append(roots, sb.WritePaths...)
	// A path the command names is bound on its own (following its links)
	// only where no folder above shows it already: under a shown folder
	// it is what the folder holds, a link still a link whose target must
	// be shown too.
	base := slices.Clone(roots)
	for _, a := range c.def.Command {
		if a = filepath.Clean(a); filepath.IsAbs(a) && !coveredBy(a, base) {
			roots = append(roots, a)
		}
	}
	roots = append(roots, helperPath, "/proc", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
	return roots
}

// shownBy returns the shown path that covers p: p itself or a folder
// above it; "" when none does.
func (c *checker) shownBy(p string) string {
	best := ""
	for _, r := range c.roots {
		if covers(r, p) && len(r) > len(best) {
			best = r
		}
	}
	if best == "" && p == c.alone {
		return p
	}
	return best
}

// covers reports whether root r shows p: p is r or lies beneath it.
func covers(r, p string) bool { return p == r || strings.HasPrefix(p, strings.TrimSuffix(r, "/")+"/") }

// coveredBy reports whether some root of roots shows p.
func coveredBy(p string, roots []string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return covers(r, p) })
}

// command resolves the executable name the way the worker does (a name
// with a '/' as it is, in the workspace when relative; else the
// sub-agent's PATH) and checks it. bound is whether the worker starts it,
// and so shows it wherever it is, rather than a program it starts (env's).
func (c *checker) command(name, why string, bound bool) {
	switch {
	case name == "agora":
		c.add(CheckStep{Path: helperPath, Why: why + ": the agora helper, first on the run's PATH", Status: CheckOK})
		return
	case filepath.IsAbs(name):
		name = filepath.Clean(name)
	case strings.Contains(name, "/"):
		rel := path.Clean(name)
		content, ok := c.def.Files[rel]
		if !ok {
			c.add(CheckStep{Path: name, Why: why + ": a path in the workspace, which no file of the definition lays down", Status: CheckMissing})
			return
		}
		p := filepath.Join("$AGORA_WORKSPACE", rel)
		c.add(CheckStep{Path: p, Why: why + ": laid down in the workspace by the definition's files", Status: CheckOK})
		if line, ok := shebang([]byte(content)); ok {
			c.interpreter(p, line, 1)
		}
		return
	default:
		p, found := c.onPath(name)
		if !found {
			c.add(CheckStep{Path: name, Why: why + ": not found on PATH", Status: CheckMissing})
			return
		}
		name, why = p, why+" (via PATH)"
	}
	// The box shows the executable itself, wherever it is (Box.Run): a
	// bind of the file its path leads to.
	if bound {
		c.alone = name
	}
	if c.mode != subagent.SandboxOff && bound && c.shownBy(name) == name && !slices.Contains(c.roots, name) {
		real, err := filepath.EvalSymlinks(name)
		if err != nil {
			real = name
		}
		if real != name {
			why += ", shown alone: the worker binds the file it leads to, " + real
		} else {
			why += ", shown alone: the worker binds this one file"
		}
		c.note("%s is shown on its own, not its folder: a program that reads files beside it (its libraries, a runtime's modules) needs %s in read_paths", name, c.suggestFor(real))
	}
	c.check(name, why, 0, true)
}

// onPath finds name in the sub-agent's PATH on this host, as the
// worker looks a command up.
func (c *checker) onPath(name string) (string, bool) {
	for _, d := range filepath.SplitList(c.path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
		if errors.Is(err, fs.ErrPermission) {
			c.note("cannot look in %s here (permission denied): a worker that can may find %s there first", d, name)
		}
	}
	return "", false
}

func (c *checker) add(s CheckStep) {
	if c.mode == subagent.SandboxOff && s.Status == CheckDenied {
		s.Status = CheckOK
	}
	c.rep.Steps = append(c.rep.Steps, s)
}

// check records the step for p, follows its symbolic links and, at the
// end of them, looks at what the file is: a script's #! line, a shim, an
// ELF program. exec is whether p is executed (not only read).
func (c *checker) check(p, why string, depth int, exec bool) {
	if c.seen[p] {
		return
	}
	c.seen[p] = true
	s := CheckStep{Path: p, Why: why, Status: CheckOK}
	root := c.shownBy(p)
	if root == "" {
		s.Status = CheckDenied
	}
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		s.Status = CheckMissing
	} else if err != nil {
		// Not this check's to judge (the CLI's user may not reach a
		// folder the worker's can): what it leads to goes unchecked.
		c.add(s)
		c.note("cannot look at %s here (%v): what it leads to is not checked", p, errors.Unwrap(err))
		return
	}
	c.add(s)
	if s.Status == CheckMissing {
		return
	}
	// A link at or above the shown path is followed by the bind (or the
	// Landlock rule) that shows it; one below stays a link in the run,
	// whose target must be shown too.
	from := root
	if root == "" {
		from = "/"
	}
	if link, target, ok := nextLink(p, from); ok && c.links < checkLinks {
		c.links++
		c.check(target, "symlink target of "+link, depth, exec)
		return
	}
	if !exec || depth >= checkDepth {
		if exec {
			c.note("%s: stopped after %d interpreters", p, checkDepth)
		}
		return
	}
	head, err := readHead(p, 256)
	if err != nil {
		c.note("cannot read %s here (%v): what it runs is not checked", p, err)
		return
	}
	switch {
	case bytes.HasPrefix(head, []byte("#!")):
		line, _ := shebang(head)
		c.interpreter(p, line, depth+1)
		c.shim(p, depth+1)
	case bytes.HasPrefix(head, []byte(elf.ELFMAG)):
		c.elf(p, depth+1)
	}
}

// nextLink finds the first symbolic link among p's components below
// from and returns it with the path p leads to through it.
func nextLink(p, from string) (link, target string, ok bool) {
	if p == from {
		return "", "", false
	}
	rest := strings.TrimPrefix(p, strings.TrimSuffix(from, "/")+"/")
	cur := from
	parts := strings.Split(rest, "/")
	for i, part := range parts {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if err != nil {
			return "", "", false
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			continue
		}
		t, err := os.Readlink(cur)
		if err != nil {
			return "", "", false
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(cur), t)
		}
		return cur, filepath.Join(append([]string{t}, parts[i+1:]...)...), true
	}
	return "", "", false
}

// readHead reads the first n bytes of the file at p.
func readHead(p string, n int) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := io.ReadFull(f, b)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, err
	}
	return b[:k], nil
}

// shebang returns a script's #! line without the #!, as the kernel reads
// it (the first line, up to 256 bytes).
func shebang(head []byte) (string, bool) {
	if !bytes.HasPrefix(head, []byte("#!")) {
		return "", false
	}
	head = head[2:min(len(head), 256)]
	if i := bytes.IndexByte(head, '\n'); i >= 0 {
		head = head[:i]
	}
	return strings.TrimSpace(string(head)), true
}

// interpreter checks the program a script's #! line names and, for
// /usr/bin/env, the program env looks up on PATH in the run.
func (c *checker) interpreter(script, line string, depth int) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		c.note("%s: empty #! line", script)
		return
	}
	interp := fields[0]
	why := fmt.Sprintf("interpreter of %s (#!%s)", script, line)
	if !filepath.IsAbs(interp) {
		c.note("%s: #!%s names a relative interpreter, found from the run's working folder (the workspace)", script, line)
		return
	}
	c.check(filepath.Clean(interp), why, depth, true)
	if filepath.Base(interp) != "env" {
		return
	}
	// env's own arguments: -S splits the rest; options (-u NAME and -C
	// DIR take a value) and NAME=value assignments come before the
	// program.
	var args []string
	for _, f := range fields[1:] {
		if rest, ok := strings.CutPrefix(f, "-S"); ok {
			if rest != "" {
				args = append(args, rest)
			}
			continue
		}
		args = append(args, f)
	}
	prog := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-u" || a == "-C" || a == "--unset" || a == "--chdir":
			i++
		case strings.HasPrefix(a, "-") || strings.Contains(a, "="):
		default:
			prog = a
		}
		if prog != "" {
			break
		}
	}
	if prog == "" {
		return
	}
	if prog == "agora" {
		c.add(CheckStep{Path: helperPath, Why: why + ": the agora helper, first on the run's PATH", Status: CheckOK})
		return
	}
	p, found := c.onPath(prog)
	if !found {
		c.add(CheckStep{Path: prog, Why: why + ": not found on PATH", Status: CheckMissing})
		return
	}
	c.check(p, why+", found on PATH", depth, true)
	if c.mode == subagent.SandboxOff || c.shownBy(p) != "" {
		return
	}
	// Inside the run, env skips the folders its root does not show.
	if alt := c.seenOnPath(prog); alt != "" {
		c.note("inside the run, %s finds %s instead of %s (the first %s on PATH that the run sees): a different program than here", interp, alt, p, prog)
	} else {
		c.note("inside the run, %s finds no %s: the run fails with \"%s: '%s': No such file or directory\"", interp, prog, filepath.Base(interp), prog)
	}
}

// seenOnPath is the first prog on the sub-agent's PATH that the run's
// root shows: what a lookup inside the run finds.
func (c *checker) seenOnPath(prog string) string {
	for _, d := range filepath.SplitList(c.path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, prog)
		if c.shownBy(p) == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

var (
	shimRootRE = regexp.MustCompile(`(?m)^export ([A-Z]+)_ROOT="([^"]+)"`)
	shimExecRE = regexp.MustCompile(`(?m)^exec "?(/[^" ]+)"?`)
)

// shim checks what a version manager's shim (pyenv, rbenv, asdf: a
// shell script in a folder named shims) runs: the manager itself and,
// for pyenv, the selected version's program.
func (c *checker) shim(p string, depth int) {
	if filepath.Base(filepath.Dir(p)) != "shims" {
		return
	}
	b, err := os.ReadFile(p)
	if err != nil || len(b) > 64<<10 {
		return
	}
	toolRoot := filepath.Dir(filepath.Dir(p))
	tool := "a version manager"
	if m := shimRootRE.FindSubmatch(b); m != nil {
		toolRoot, tool = filepath.Clean(string(m[2])), strings.ToLower(string(m[1]))
	}
	if m := shimExecRE.FindSubmatch(b); m != nil {
		c.check(filepath.Clean(string(m[1])), "run by the "+tool+" shim "+p, depth, true)
	}
	if c.mode != subagent.SandboxOff && c.shownBy(toolRoot) == "" {
		c.note("%s is a %s shim: it runs the selected version under %s, so read_paths needs the whole tool root %s", p, tool, toolRoot, toolRoot)
	}
	if tool != "pyenv" {
		return
	}
	version, from := c.pyenvVersion, "PYENV_VERSION"
	if version == "" {
		from = filepath.Join(toolRoot, "version")
		if b, err := os.ReadFile(from); err == nil {
			version = strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
		}
	}
	if version == "" || version == "system" {
		return
	}
	target := filepath.Join(toolRoot, "versions", version, "bin", filepath.Base(p))
	c.check(target, fmt.Sprintf("run by the pyenv shim %s (version %s, from %s)", p, version, from), depth, true)
}

// elf checks an ELF program's loader (PT_INTERP), the libraries its
// RUNPATH (or RPATH) finds, and a Python's standard library beside it.
func (c *checker) elf(p string, depth int) {
	f, err := elf.Open(p)
	if err != nil {
		c.note("%s: not a readable ELF file here: %v", p, err)
		return
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(prog.Open())
		if err != nil {
			break
		}
		if interp := string(bytes.TrimRight(b, "\x00")); filepath.IsAbs(interp) {
			c.check(filepath.Clean(interp), "ELF interpreter of "+p, depth, true)
		}
		break
	}
	var dirs []string
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		vals, _ := f.DynString(tag)
		for _, v := range vals {
			for _, d := range filepath.SplitList(v) {
				d = strings.NewReplacer("$ORIGIN", filepath.Dir(p), "${ORIGIN}", filepath.Dir(p)).Replace(d)
				if filepath.IsAbs(d) {
					dirs = append(dirs, filepath.Clean(d))
				}
			}
		}
	}
	if len(dirs) > 0 {
		needed, _ := f.ImportedLibraries()
		for _, lib := range needed {
			for _, d := range dirs {
				if l := filepath.Join(d, lib); exists(l) {
					c.check(l, "library of "+p+" (RUNPATH)", depth, false)
					break
				}
			}
		}
	}
	if name := filepath.Base(p); strings.HasPrefix(name, "python") && filepath.Base(filepath.Dir(p)) == "bin" {
		lib := filepath.Join(filepath.Dir(filepath.Dir(p)), "lib")
		matches, _ := filepath.Glob(filepath.Join(lib, "python3*", "os.py"))
		if m, _ := filepath.Glob(filepath.Join(lib, name, "os.py")); len(m) > 0 {
			matches = m
		}
		for _, m := range matches {
			c.check(filepath.Dir(m), "standard library of "+p, depth, false)
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// suggest fills in each denied step's read_paths entry and the report's
// list: the smallest sensible folder of each, merged.
func (c *checker) suggest() {
	var add []string
	for i, s := range c.rep.Steps {
		if s.Status != CheckDenied {
			continue
		}
		c.rep.Steps[i].Suggest = c.suggestFor(s.Path)
		add = append(add, c.rep.Steps[i].Suggest)
	}
	if len(add) == 0 {
		return
	}
	slices.Sort(add)
	add = slices.Compact(add)
	var merged []string
	for _, a := range add {
		if !slices.ContainsFunc(merged, func(m string) bool { return strings.HasPrefix(a, m+"/") }) {
			merged = append(merged, a)
		}
	}
	c.rep.Add = merged
	c.rep.ReadPaths = append(slices.Clone(c.def.Sandbox.ReadPaths), merged...)
}

// suggestFor is the read_paths entry that would show p: under a home
// folder the tool's root (~/.pyenv, ~/.nvm, ~/.local/share/NAME); under
// /etc its entry there; otherwise p's folder.
func (c *checker) suggestFor(p string) string {
	for _, h := range c.homes(p) {
		rel := strings.Split(strings.TrimPrefix(p, h+"/"), "/")
		switch {
		case len(rel) == 1:
			return p
		case rel[0] == ".local" && len(rel) > 3 && (rel[1] == "share" || rel[1] == "lib"):
			return filepath.Join(h, rel[0], rel[1], rel[2])
		case rel[0] == ".local" && len(rel) > 2:
			return filepath.Join(h, rel[0], rel[1])
		}
		return filepath.Join(h, rel[0])
	}
	if rest, ok := strings.CutPrefix(p, "/etc/"); ok {
		return filepath.Join("/etc", strings.Split(rest, "/")[0])
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return p
	}
	if d := filepath.Dir(p); d != "/" {
		return d
	}
	return p
}

// homes are the home folders p lies under: /root, /home/NAME and $HOME.
func (c *checker) homes(p string) []string {
	var hs []string
	if strings.HasPrefix(p, "/root/") {
		hs = append(hs, "/root")
	}
	if rest, ok := strings.CutPrefix(p, "/home/"); ok && strings.Contains(rest, "/") {
		hs = append(hs, "/home/"+strings.Split(rest, "/")[0])
	}
	if h := filepath.Clean(c.home); filepath.IsAbs(h) && h != "/" && strings.HasPrefix(p, h+"/") {
		hs = append(hs, h)
	}
	return hs
}
