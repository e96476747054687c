package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// The sandbox of one run (docs/sandbox.md): the launcher policy built from
// the definition's sandbox block, the cgroup that bounds processes and
// memory where the worker may make one, and the report in `started`.

// workspaceWatch is how often a run's workspace size is checked.
const workspaceWatch = time.Second

// System paths a sandboxed run may read and execute.
var (
	systemDirs    = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys/devices/system/cpu"}
	strictEtc     = []string{"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group", "/etc/localtime", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl", "/etc/ca-certificates", "/etc/alternatives", "/etc/os-release", "/etc/mime.types"}
	deviceRW      = []string{"/dev/null", "/dev/zero", "/dev/full"}
	deviceRO      = []string{"/dev/urandom", "/dev/random"}
	errLimit      = errors.New("worker: sandbox limit exceeded")
	cgroupV1Roots = []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory"}
)

// runSandbox is one run's sandbox.
type runSandbox struct {
	isolation sandbox.Mode
	// tmpfsWorkspace: the workspace gets a filesystem of its own, sized
	// workspace_size (mountWorkspace); launcherFS: the launcher makes it
	// (a worker that is not root), and view holds its root once it did.
	tmpfsWorkspace bool
	launcherFS     bool
	view           atomic.Pointer[os.File]
	runUID         int    // the run's host uid; 0: the worker's own
	helper         string // the agora binary shown at helperPath
	binds          []sandbox.Bind
	cgroups        []string
	egress         []string // the proxy's allow rules; none: no proxy
	proxy          *egress.Proxy
	egressBase     egress.Config // the worker\'s template (Deps.Egress)
	def            subagent.Sandbox
	command        []string
	ports          []int
	useCgroups     bool
	privateProc    bool
	mode           string
	policy         sandbox.Policy
	limits         subagent.Resolved
	report         *lifecycle.Sandbox
	env            map[string]string // TMPDIR and HOME for the run
	pool           *cgroupPool       // the worker's cgroups
	cgset          *cgroupSet        // the run's, while it runs
	over           atomic.Value      // string: the limit a watcher saw passed
	pathEnv        string            // the sub-agent's PATH before the helper's folder
	wsMounted      string            // the workspace's own tmpfs, while mounted
	wsRoot         *os.File          // its root, locked, while mounted (mountWorkspace)
	wsDir          *os.File          // the workspace folder, locked (prepareWorkspace)
	log            *slog.Logger
}

// egressRules are the destinations the definition lets the run reach
// through the egress proxy (docs/sandbox.md, "Egress proxy").
func egressRules(sb subagent.Sandbox) []string {
	if sb.ModeOrDefault() == subagent.SandboxStrict {
		return nil
	}
	return sb.Network.Allow
}

// cgroupsUsable reports whether the worker can make per-run cgroups for
// processes and memory (cgroup v1 controllers it may write, as root in a
// container).
func cgroupsUsable() bool {
	for _, r := range cgroupV1Roots {
		// Only a mounted cgroup v1 hierarchy (cgroup.clone_children exists
		// only there): on a v2-only host these paths do not exist, and
		// creating them would make cgroups of the wrong kind.
		if _, err := os.Stat(filepath.Join(r, "cgroup.clone_children")); err != nil {
			return false
		}
		dir := filepath.Join(r, "agora")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false
		}
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
			return false
		}
		// Another (root) worker may have made the folder: this one must
		// be able to make cgroups in it too.
		if unix.Access(dir, unix.W_OK|unix.X_OK) != nil {
			return false
		}
	}
	return true
}

// newRunSandbox resolves a run's sandbox from its definition: mode,
// limits and the report for `started`. prepare lays it out once the
// workspace exists.
func (s *Service) newRunSandbox(def subagent.Definition, timeout time.Duration) *runSandbox {
	sb := def.Sandbox
	rs := &runSandbox{mode: sb.ModeOrDefault(), limits: sb.Limits.Resolve(timeout), env: map[string]string{}, ports: sb.Ports(), def: sb, command: def.Command,
		isolation: s.launcher.Mode(), helper: s.helper, egress: egressRules(sb), log: s.log, egressBase: s.egress}
	ownFS := rs.isolation == sandbox.ModeNamespaces && !s.cfg.KeepWorkspaces && s.cfg.SandboxWorkspace != "watch" && rs.mode != subagent.SandboxOff && rs.limits.WorkspaceSize > 0
	rs.tmpfsWorkspace = ownFS && os.Geteuid() == 0
	rs.launcherFS = ownFS && os.Geteuid() != 0
	host := s.launcher.Host()
	if rs.isolation == sandbox.ModeNamespaces && host.RunUID != os.Geteuid() {
		rs.runUID = host.RunUID
	}
	rs.report = &lifecycle.Sandbox{Mode: rs.mode, Isolation: string(s.launcher.Mode()), LandlockABI: host.LandlockABI}
	if rs.mode == subagent.SandboxOff {
		rs.report.Isolation = string(s.launcher.UnconfinedMode())
		return rs
	}
	l := rs.limits
	rs.useCgroups = s.cgroups && (l.Processes > 0 || l.Memory > 0)
	limits := map[string]int64{"memory": l.Memory, "open_files": l.OpenFiles, "file_size": l.FileSize,
		"workspace_size": l.WorkspaceSize, "cpu_time": int64(l.CPUTime / time.Second), "processes": l.Processes}
	if l.CPUTime == 0 {
		limits["cpu_time"] = subagent.Unlimited
	}
	if !rs.useCgroups && !rs.nprocLimit() {
		// Without a cgroup or a user namespace of its own the process
		// count is not bounded (RLIMIT_NPROC would count every process
		// of the user, the worker's included).
		limits["processes"] = subagent.Unlimited
	}
	rs.report.Filesystem = host.LandlockABI >= 1
	rs.report.Network = host.LandlockABI >= 4
	rs.report.PrivateProc = host.PrivateProc
	rs.report.Cgroup = rs.useCgroups
	rs.report.Limits = limits
	if rs.report.Network {
		rs.report.TCPPorts = rs.ports
		if rs.report.TCPPorts == nil {
			rs.report.TCPPorts = []int{}
		}
	}
	rs.privateProc = host.PrivateProc
	rs.pool = s.cgpool
	if rs.isolation == sandbox.ModeNamespaces {
		rs.report.NetworkNamespace, rs.report.OwnRoot, rs.report.Seccomp, rs.report.NoCapabilities = true, true, true, true
		rs.report.Egress = rs.egress
		rs.report.WorkspaceFS = "watched"
		if rs.tmpfsWorkspace || rs.launcherFS {
			rs.report.WorkspaceFS = "tmpfs"
		}
	}
	return rs
}

// prepare lays the sandbox out for workspace ws: a private tmp and home,
// the launcher policy and the run's cgroups.
func (rs *runSandbox) prepare(ws string) error {
	if rs.mode == subagent.SandboxOff {
		return nil
	}
	tmp := filepath.Join(ws, ".agora", "tmp")
	home := filepath.Join(ws, ".agora", "home")
	for _, d := range []string{tmp, home} {
		// A parked workspace (workspace.go) has them already, empty.
		if err := os.Mkdir(d, 0o700); err != nil && !(errors.Is(err, fs.ErrExist) && pristineDir(d)) {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	rs.env["TMPDIR"], rs.env["HOME"] = tmp, home
	ns := rs.isolation == sandbox.ModeNamespaces
	p := sandbox.Policy{Landlock: true, Rlimits: map[string]uint64{}, Root: ns, Loopback: ns, Seccomp: ns}
	p.WriteDirs = append([]string{ws}, rs.def.WritePaths...)
	p.ReadDirs = append(append([]string{}, systemDirs...), rs.def.ReadPaths...)
	if rs.mode == subagent.SandboxStrict {
		p.ReadFiles = append(p.ReadFiles, strictEtc...)
	} else {
		p.ReadDirs = append(p.ReadDirs, "/etc")
	}
	if rs.privateProc {
		p.ReadDirs = append(p.ReadDirs, "/proc")
	}
	// Absolute paths the definition's command names (a script given to
	// an interpreter, a config file) are readable: the definition's author
	// chose them.
	for _, a := range rs.command {
		if !filepath.IsAbs(a) {
			continue
		}
		if fi, err := os.Stat(a); err == nil && fi.IsDir() {
			p.ReadDirs = append(p.ReadDirs, a)
		} else if err == nil {
			p.ReadFiles = append(p.ReadFiles, a)
		}
	}
	if ns {
		if err := rs.namespacePolicy(&p); err != nil {
			return err
		}
	} else {
		p.WriteFiles = deviceRW
		p.ReadFiles = append(p.ReadFiles, deviceRO...)
	}
	p.TCPConnect = append(p.TCPConnect, rs.ports...)
	l := rs.limits
	set := func(name string, v int64) {
		if v > 0 {
			p.Rlimits[name] = uint64(v)
		}
	}
	set("as", l.Memory)
	if rs.nprocLimit() {
		set("nproc", l.Processes)
	}
	set("nofile", l.OpenFiles)
	set("fsize", l.FileSize)
	if l.CPUTime > 0 {
		set("cpu", int64((l.CPUTime+time.Second-1)/time.Second))
	}
	rs.policy = p
	if rs.useCgroups {
		return rs.makeCgroups()
	}
	return nil
}

// nprocLimit reports whether the run's processes are bounded by
// RLIMIT_NPROC rather than a cgroup: a run in a user namespace of its own
// without a cgroup (a worker that is not root). RLIMIT_NPROC counts the
// tasks of a uid in its user namespace, which is the run's own
// (docs/sandbox.md, "Limits").
func (rs *runSandbox) nprocLimit() bool {
	return rs.isolation == sandbox.ModeNamespaces && !rs.useCgroups && rs.limits.Processes > 0
}

// makeCgroups gives the run a cgroup of the worker's pool (v1 pids and
// memory, one directory per hierarchy) with the run's limits; the launcher
// joins them before it starts the runtime.
func (rs *runSandbox) makeCgroups() error {
	set, err := rs.pool.take()
	if err != nil {
		return fmt.Errorf("sandbox: cgroup: %w", err)
	}
	rs.cgset = set
	for _, dir := range set.dirs {
		var file, value string
		switch {
		case strings.Contains(dir, "/pids/") && rs.limits.Processes > 0:
			file, value = "pids.max", strconv.FormatInt(rs.limits.Processes, 10)
		case strings.Contains(dir, "/memory/") && rs.limits.Memory > 0:
			file, value = "memory.limit_in_bytes", strconv.FormatInt(rs.limits.Memory, 10)
			_ = os.WriteFile(filepath.Join(dir, "memory.failcnt"), []byte("0"), 0)
		}
		if file != "" {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
				return fmt.Errorf("sandbox: cgroup %s: %w", file, err)
			}
		}
		rs.cgroups = append(rs.cgroups, filepath.Join(dir, "cgroup.procs"))
	}
	set.pidsMax = pidsEvents(set)
	return nil
}

// namespacePolicy adds to p what a run in namespaces of its own gets: the
// binds its root shows, its private /tmp and /dev/shm, the agora helper
// and the egress proxy (docs/sandbox.md, "Namespaces").
func (rs *runSandbox) namespacePolicy(p *sandbox.Policy) error {
	// The run's root shows these paths of the host and nothing else
	// (the launcher makes /proc, /dev, /tmp and /dev/shm itself).
	for _, d := range p.ReadDirs {
		if d != "/proc" {
			rs.binds = append(rs.binds, sandbox.Bind{Host: d, Target: d})
		}
	}
	for _, f := range p.ReadFiles {
		rs.binds = append(rs.binds, sandbox.Bind{Host: f, Target: f})
	}
	for _, d := range p.WriteDirs {
		rs.binds = append(rs.binds, sandbox.Bind{Host: d, Target: d, Write: true})
	}
	if rs.launcherFS && len(p.WriteDirs) > 0 {
		p.Workspace, p.WorkspaceSize = p.WriteDirs[0], uint64(rs.limits.WorkspaceSize)
	}
	p.WriteDirs = append(p.WriteDirs, "/tmp", "/dev/shm")
	if rs.helper != "" {
		rs.binds = append(rs.binds, sandbox.Bind{Host: rs.helper, Target: helperPath})
		p.ReadFiles = append(p.ReadFiles, helperPath)
		rs.env["PATH"] = filepath.Dir(helperPath) + ":" + subagentPath(rs.pathEnv)
	}
	if exe := selfExe(); exe != "" {
		// The require_input MCP server the claude-code runtime starts.
		rs.binds = append(rs.binds, sandbox.Bind{Host: exe, Target: exe})
		p.ReadFiles = append(p.ReadFiles, exe)
	}
	p.WriteFiles = deviceRW
	p.ReadFiles = append(p.ReadFiles, deviceRO...)
	// The network is the run's own: loopback, and the egress proxy on
	// 127.0.0.1:proxyPort when the definition allows destinations.
	if len(rs.egress) > 0 {
		cfg := rs.egressBase
		cfg.Allow, cfg.Logger = rs.egress, rs.log
		px, err := egress.New(cfg)
		if err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		rs.proxy = px
		p.ProxyPort = proxyPort
		proxy := "http://127.0.0.1:" + strconv.Itoa(proxyPort)
		for _, k := range []string{"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy"} {
			rs.env[k] = proxy
		}
		rs.env["NO_PROXY"], rs.env["no_proxy"] = "localhost,127.0.0.1,::1", "localhost,127.0.0.1,::1"
		p.TCPConnect = append(p.TCPConnect, proxyPort)
	}
	return nil
}

// absPath finds absolute paths in a program's error output.
var absPath = regexp.MustCompile(`/[A-Za-z0-9._+@-]+(?:/[A-Za-z0-9._+@-]+)+`)

// failureNote says, for a run that could not start or died without a
// sentinel, which paths its command needs that the sandbox hides and the
// read_paths line that would show them (docs/sandbox.md, "Checking a
// definition"). It resolves the command as `agora subagent check` does —
// the #! chain, symbolic links to their targets, shims, env lookups — so
// a hidden interpreter is named even when the error names only the
// script; failing that, it names the hidden paths the output mentions.
func (rs *runSandbox) failureNote(def subagent.Definition, output string) string {
	if rs == nil || rs.isolation != sandbox.ModeNamespaces || rs.mode == subagent.SandboxOff {
		return ""
	}
	rep := CheckDefinition(def, os.Environ())
	if rep.Denied() && len(rep.Add) > 0 {
		var hidden []string
		for _, st := range rep.Steps {
			if st.Status == CheckDenied && len(hidden) < 5 {
				hidden = append(hidden, st.Path+" ("+st.Why+")")
			}
		}
		return fmt.Sprintf(" (the sandbox does not show %s to the run: to allow it, add sandbox.read_paths: [%s] to the definition; agora subagent check %s lists every path its command needs)",
			strings.Join(hidden, ", "), strings.Join(rep.Add, ", "), def.Name)
	}
	return rs.hiddenNote(output)
}

// hiddenNote names the paths a failed run's output mentions that exist on
// the worker's host but are not in the run's root, and the read_paths line
// that would show them (a program that dies on a path the sandbox hides
// rarely says so itself).
func (rs *runSandbox) hiddenNote(output string) string {
	if rs == nil || rs.isolation != sandbox.ModeNamespaces || rs.mode == subagent.SandboxOff {
		return ""
	}
	var hidden []string
	for _, p := range absPath.FindAllString(output, 50) {
		p = filepath.Clean(p)
		if slices.Contains(hidden, p) || rs.shows(p) {
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			hidden = append(hidden, p)
		}
		if len(hidden) == 5 {
			break
		}
	}
	if len(hidden) == 0 {
		return ""
	}
	// The paths come from what the run printed, so no link of them is
	// followed to its target: that is the host's to keep. The command's
	// own links are followed by failureNote's check, from the definition.
	dirs := make([]string, 0, len(hidden))
	for _, p := range hidden {
		d := p
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			d = filepath.Dir(p)
		}
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return fmt.Sprintf(" (the sandbox does not show %s to the run: to allow it, add sandbox.read_paths: [%s] to the definition; agora subagent check lists every path a command needs)",
		strings.Join(hidden, ", "), strings.Join(dirs, ", "))
}

// shows reports whether the run's root shows path p.
func (rs *runSandbox) shows(p string) bool {
	if p == "/proc" || strings.HasPrefix(p, "/proc/") || p == helperPath {
		return true // the run's own /proc; the helper
	}
	for _, b := range rs.binds {
		if p == b.Target || strings.HasPrefix(p, strings.TrimSuffix(b.Target, "/")+"/") {
			return true
		}
	}
	return false
}

// helperPath is where a sandboxed run finds the agora binary; its folder
// leads the run's PATH. proxyPort is the egress proxy's port on the run's
// own loopback.
const (
	helperPath = "/run/agora/bin/agora"
	proxyPort  = 3128
)

// sandboxHelper finds the agora binary runs get as `agora`: configured,
// else the worker's own executable when it is agora, else agora next to
// it; "" when there is none.
func sandboxHelper(configured string) string {
	if configured != "" {
		return configured
	}
	exe := selfExe()
	if exe == "" {
		return ""
	}
	if filepath.Base(exe) == "agora" {
		return exe
	}
	p := filepath.Join(filepath.Dir(exe), "agora")
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return p
	}
	return ""
}

// subagentPath is the PATH a sandboxed run keeps after the helper's
// folder.
func subagentPath(p string) string {
	if p == "" {
		return "/usr/local/bin:/usr/bin:/bin"
	}
	return p
}

// giveWorkspace hands ws and everything in it (all the worker's own, made
// for this run) to the run's host user, when runs have one of their own.
func (rs *runSandbox) giveWorkspace(ws string) error {
	if rs == nil || rs.runUID == 0 || rs.mode == subagent.SandboxOff {
		return nil
	}
	return filepath.WalkDir(ws, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, rs.runUID, rs.runUID)
	})
}

// takeWorkspace gives the workspace's own folders back to the worker once
// the run is over (and every process of it gone), so a parked workspace
// is the worker's again; what the run made in them is removed as the
// worker's anyway. Links are never followed.
func (rs *runSandbox) takeWorkspace(ws string) {
	if rs == nil || rs.runUID == 0 || rs.mode == subagent.SandboxOff {
		return
	}
	for _, d := range []string{ws, filepath.Join(ws, ".agora"), filepath.Join(ws, ".agora", "artifacts"), filepath.Join(ws, ".agora", "home"), filepath.Join(ws, ".agora", "tmp")} {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			_ = os.Lchown(d, os.Geteuid(), os.Getegid())
		}
	}
}

// mountWorkspace gives the run's workspace a filesystem of its own whose
// size is workspace_size (docs/sandbox.md, "The workspace's own
// filesystem"): a write past it fails with ENOSPC inside the run, before
// the host's disk sees it. Only a root worker whose runs have namespaces of
// their own does so (mounting needs root in the host's mount namespace);
// others watch the workspace's size once a second. The workspace's own
// folders are made anew on it.
func (rs *runSandbox) mountWorkspace(ws string) error {
	if rs == nil || !rs.tmpfsWorkspace || rs.mode == subagent.SandboxOff || rs.limits.WorkspaceSize <= 0 {
		return nil
	}
	size := rs.limits.WorkspaceSize
	inodes := max(size/(4<<10), 1024) // one inode per 4 KiB, as ext4 allows by default
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", size, inodes)
	if err := mountTmpfs(ws, opts); err != nil {
		return fmt.Errorf("sandbox: workspace filesystem: %w", err)
	}
	rs.wsMounted = ws
	// The path now leads to the new filesystem's root, which no lock
	// covers yet: lock it before it holds an .agora directory, so a sweep
	// that takes the lock first finds none and lets go, and one that
	// comes later finds it held (docs/worker.md, "Why a sweep never
	// touches a live run"). The launcher keeps this lock too.
	root, err := lockDir(ws, false)
	if err != nil {
		return fmt.Errorf("sandbox: workspace filesystem: lock: %w", err)
	}
	rs.wsRoot = root
	if rs.wsDir != nil && samePathFile(ws, rs.wsDir) {
		return errors.New("sandbox: workspace filesystem: the mount did not take the workspace's place")
	}
	for _, d := range []string{".agora", filepath.Join(".agora", "artifacts")} {
		if err := unix.Mkdirat(int(root.Fd()), d, 0o700); err != nil {
			return fmt.Errorf("sandbox: workspace filesystem: %w", err)
		}
	}
	return nil
}

// unmountWorkspace lets the workspace's own filesystem go, once the run's
// results are read: what the run wrote goes with it, and the folder under
// it is the worker's pristine one again. The filesystem's lock is let go
// only once it no longer covers the folder.
func (rs *runSandbox) unmountWorkspace() {
	if rs == nil {
		return
	}
	if rs.wsMounted != "" {
		detach(rs.wsMounted)
		rs.wsMounted = ""
	}
	if rs.wsRoot != nil {
		rs.wsRoot.Close()
		rs.wsRoot = nil
	}
}

// launcherHold is the lock the launcher keeps while the run lives: the
// workspace's own filesystem's when the worker mounted one (the path leads
// there), else the folder's.
func (rs *runSandbox) launcherHold(dir *os.File) *os.File {
	if rs != nil && rs.wsRoot != nil {
		return rs.wsRoot
	}
	return dir
}

// wsFull reports whether the workspace's own filesystem is (all but)
// full: the run met ENOSPC there.
func (rs *runSandbox) wsFull() bool {
	if rs == nil || rs.wsRoot == nil {
		return false
	}
	return fsFull(fdPath(rs.wsRoot))
}

// viewOr is where the worker reads the run's workspace: through the
// descriptor of what the run wrote to — the root of the workspace's own
// filesystem the launcher made, once it did, or the one the worker
// mounted, or the locked folder — else ws. So what the worker reads is
// what the run wrote, whatever became of the path meanwhile (lost says
// whether it still leads there).
func (rs *runSandbox) viewOr(ws string) string {
	if rs != nil {
		if f := rs.view.Load(); f != nil {
			return fdPath(f)
		}
		if rs.wsRoot != nil {
			return fdPath(rs.wsRoot)
		}
		if rs.wsDir != nil {
			return fdPath(rs.wsDir)
		}
	}
	return ws
}

// fdPath names the file f has open, for the functions that take a path.
func fdPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }

// lost says what became of the run's workspace when it is no longer the
// one the run wrote to — the folder gone, replaced, the run's own
// filesystem no longer mounted on it, .agora gone — and "" while it is.
// A run whose workspace was lost fails workspace-lost: whatever the
// worker would read there is not what the run left.
func (rs *runSandbox) lost(ws string) string {
	if rs == nil || rs.wsDir == nil {
		return ""
	}
	want, what := rs.wsDir, "folder"
	if rs.wsRoot != nil {
		want, what = rs.wsRoot, "own filesystem"
	}
	var st unix.Stat_t
	if err := unix.Lstat(ws, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Sprintf("the workspace %s is gone: it was removed while the run lived", ws)
		}
		return fmt.Sprintf("the workspace %s cannot be read: %v", ws, err)
	}
	if !samePathFile(ws, want) {
		return fmt.Sprintf("the workspace %s no longer leads to the run's %s: it was unmounted or replaced while the run lived", ws, what)
	}
	var ag unix.Stat_t
	if err := unix.Lstat(filepath.Join(rs.viewOr(ws), ".agora"), &ag); err != nil || ag.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Sprintf("the workspace %s has no .agora directory any more", ws)
	}
	return ""
}

// viewFull is wsFull for the filesystem the launcher made.
func (rs *runSandbox) viewFull() bool {
	if rs == nil {
		return false
	}
	f := rs.view.Load()
	return f != nil && fsFull(fdPath(f))
}

// cgroupSet is one pooled cgroup per hierarchy. Making and removing
// cgroups costs milliseconds, so a worker keeps one set per slot.
type cgroupSet struct {
	dirs    []string
	pidsMax int64 // pids.events "max" when the run began
}

// cgroupPool hands out the worker's cgroup sets.
type cgroupPool struct {
	mu    sync.Mutex
	name  string // the worker's prefix
	free  []*cgroupSet
	all   []*cgroupSet
	count int
}

func (p *cgroupPool) take() (*cgroupSet, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		set := p.free[n-1]
		p.free = p.free[:n-1]
		// Another worker starting on this host removes empty cgroups:
		// make sure ours are still there.
		for _, dir := range set.dirs {
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, err
			}
		}
		return set, nil
	}
	p.count++
	set := &cgroupSet{}
	for _, root := range cgroupV1Roots {
		dir := filepath.Join(root, "agora", fmt.Sprintf("%s-%d", p.name, p.count))
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		set.dirs = append(set.dirs, dir)
	}
	p.all = append(p.all, set)
	return set, nil
}

// put returns a set whose run is over; the launcher has reaped every
// process of it, so the set is empty.
func (p *cgroupPool) put(set *cgroupSet) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, set)
}

// removeAll removes the pool's own cgroups, at shutdown.
func (p *cgroupPool) removeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, set := range p.all {
		for _, dir := range set.dirs {
			_ = syscall.Rmdir(dir)
		}
	}
	p.free, p.all = nil, nil
}

// removeStale removes cgroups that workers which are gone left behind:
// their names start with the pid of the worker process that made them.
func removeStale() {
	for _, root := range cgroupV1Roots {
		ents, _ := os.ReadDir(filepath.Join(root, "agora"))
		for _, e := range ents {
			pid, _, ok := strings.Cut(e.Name(), "-")
			if !ok || !e.IsDir() {
				continue
			}
			if _, err := os.Stat("/proc/" + pid); err == nil {
				continue // its worker lives
			}
			_ = syscall.Rmdir(filepath.Join(root, "agora", e.Name()))
		}
	}
}

func pidsEvents(set *cgroupSet) int64 {
	for _, dir := range set.dirs {
		if b, err := os.ReadFile(filepath.Join(dir, "pids.events")); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
	}
	return 0
}

// passed names the limit the run went over, if any: from a watcher, the
// signal that ended the runtime, or the cgroups' counters.
func (rs *runSandbox) passed(res Result) string {
	if v, _ := rs.over.Load().(string); v != "" {
		return v
	}
	if rs.wsFull() || rs.viewFull() {
		return fmt.Sprintf("workspace_size (%d bytes: the workspace's filesystem is full)", rs.limits.WorkspaceSize)
	}
	switch res.Signal {
	case "SIGXCPU":
		return fmt.Sprintf("cpu_time (%s)", rs.limits.CPUTime)
	case "SIGXFSZ":
		return fmt.Sprintf("file_size (%d bytes)", rs.limits.FileSize)
	}
	if set := rs.cgset; set != nil {
		if pidsEvents(set) > set.pidsMax {
			return fmt.Sprintf("processes (%d)", rs.limits.Processes)
		}
		for _, dir := range set.dirs {
			if b, err := os.ReadFile(filepath.Join(dir, "memory.failcnt")); err == nil && strings.TrimSpace(string(b)) != "0" {
				return fmt.Sprintf("memory (%d bytes)", rs.limits.Memory)
			}
		}
	}
	return ""
}

// close hands the run's cgroups back to the pool: the launcher is gone,
// so are their processes.
func (rs *runSandbox) close() {
	if rs == nil {
		return
	}
	if f := rs.view.Swap(nil); f != nil {
		f.Close()
	}
	rs.wsDir = nil // the invocation's lock, parked or closed with the workspace
	if rs.cgset == nil {
		return
	}
	rs.pool.put(rs.cgset)
	rs.cgset = nil
}

// workspaceSize adds up the sizes of the regular files under ws, without
// following links.
func workspaceSize(ws string) int64 {
	var n int64
	_ = filepath.WalkDir(ws, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// egressNote says what the run's egress proxy refused (the first few
// destinations, each once), or, for a run whose output shows a failed
// name lookup, how egress works in the sandbox: a program that dies on a
// refused connection rarely says which destination it wanted, nor why
// (docs/sandbox.md, "Egress").
func (rs *runSandbox) egressNote(output string) string {
	if rs == nil || rs.mode == subagent.SandboxOff {
		return ""
	}
	var parts []string
	if rs.proxy != nil {
		for _, r := range rs.proxy.Refusals() {
			switch {
			case r.Reason == egress.ReasonNotAllowed:
				parts = append(parts, fmt.Sprintf("egress to %s refused: add it to sandbox.network.allow", r.Target))
			case r.Status == http.StatusForbidden:
				parts = append(parts, fmt.Sprintf("egress to %s refused: %s", r.Target, clip.String(strings.TrimPrefix(r.Reason, "egress: "), 200)))
			default:
				parts = append(parts, fmt.Sprintf("egress to %s failed: %s", r.Target, clip.String(strings.TrimPrefix(r.Reason, "egress: "), 200)))
			}
		}
	}
	if len(parts) == 0 && lookupFailed.MatchString(output) {
		if rs.proxy == nil {
			parts = append(parts, "the run has no network: its definition allows no destination; egress goes through Agora's proxy to the destinations sandbox.network.allow names")
		} else {
			parts = append(parts, "name resolution inside the run fails by design: egress goes through the proxy in HTTPS_PROXY, which resolves the destinations sandbox.network.allow names")
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// lookupFailed matches what programs print when a name does not resolve.
var lookupFailed = regexp.MustCompile(`(?i)could not resolve host|temporary failure in name resolution|name or service not known|no such host|getaddrinfo|nodename nor servname|name resolution`)
