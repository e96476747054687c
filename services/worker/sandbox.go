package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

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
	def         subagent.Sandbox
	command     []string
	ports       []int
	useCgroups  bool
	privateProc bool
	mode        string
	policy      sandbox.Policy
	limits      subagent.Resolved
	report      *lifecycle.Sandbox
	env         map[string]string // TMPDIR and HOME for the run
	cgroups     []string          // cgroup directories to remove after the run
	over        atomic.Value      // string: the limit a watcher saw passed
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
	}
	return true
}

// newRunSandbox resolves a run's sandbox from its definition: mode,
// limits and the report for `started`. prepare lays it out once the
// workspace exists.
func (s *Service) newRunSandbox(def subagent.Definition, timeout time.Duration) *runSandbox {
	sb := def.Sandbox
	rs := &runSandbox{mode: sb.ModeOrDefault(), limits: sb.Limits.Resolve(timeout), env: map[string]string{}, ports: sb.Ports(), def: sb, command: def.Command}
	host := s.launcher.Host()
	rs.report = &lifecycle.Sandbox{Mode: rs.mode, Isolation: string(s.launcher.Mode()), LandlockABI: host.LandlockABI}
	if rs.mode == subagent.SandboxOff {
		return rs
	}
	l := rs.limits
	rs.useCgroups = s.cgroups && (l.Processes > 0 || l.Memory > 0)
	limits := map[string]int64{"memory": l.Memory, "open_files": l.OpenFiles, "file_size": l.FileSize,
		"workspace_size": l.WorkspaceSize, "cpu_time": int64(l.CPUTime / time.Second), "processes": l.Processes}
	if l.CPUTime == 0 {
		limits["cpu_time"] = subagent.Unlimited
	}
	if !rs.useCgroups {
		// Without a cgroup the process count is not bounded (RLIMIT_NPROC
		// counts every process of the user, the worker's included).
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
	return rs
}

// prepare lays the sandbox out for workspace ws: a private tmp and home,
// the launcher policy and the run's cgroups.
func (rs *runSandbox) prepare(ws, runID string) error {
	if rs.mode == subagent.SandboxOff {
		return nil
	}
	tmp := filepath.Join(ws, ".agora", "tmp")
	home := filepath.Join(ws, ".agora", "home")
	for _, d := range []string{tmp, home} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	rs.env["TMPDIR"], rs.env["HOME"] = tmp, home
	p := sandbox.Policy{Landlock: true, Rlimits: map[string]uint64{}}
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
	p.WriteFiles = deviceRW
	p.ReadFiles = append(p.ReadFiles, deviceRO...)
	p.TCPConnect = append(p.TCPConnect, rs.ports...)
	l := rs.limits
	set := func(name string, v int64) {
		if v > 0 {
			p.Rlimits[name] = uint64(v)
		}
	}
	set("as", l.Memory)
	set("nofile", l.OpenFiles)
	set("fsize", l.FileSize)
	if l.CPUTime > 0 {
		set("cpu", int64((l.CPUTime+time.Second-1)/time.Second))
	}
	rs.policy = p
	if rs.useCgroups {
		return rs.makeCgroups(runID)
	}
	return nil
}

// makeCgroups creates the run's cgroups (v1 pids and memory) with its
// limits; the launcher joins them before it starts the runtime.
func (rs *runSandbox) makeCgroups(runID string) error {
	for _, root := range cgroupV1Roots {
		dir := filepath.Join(root, "agora", runID)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("sandbox: cgroup: %w", err)
		}
		rs.cgroups = append(rs.cgroups, dir)
		var file, value string
		switch {
		case strings.HasSuffix(root, "pids") && rs.limits.Processes > 0:
			file, value = "pids.max", strconv.FormatInt(rs.limits.Processes, 10)
		case strings.HasSuffix(root, "memory") && rs.limits.Memory > 0:
			file, value = "memory.limit_in_bytes", strconv.FormatInt(rs.limits.Memory, 10)
		}
		if file != "" {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
				return fmt.Errorf("sandbox: cgroup %s: %w", file, err)
			}
		}
		rs.policy.Cgroups = append(rs.policy.Cgroups, filepath.Join(dir, "cgroup.procs"))
	}
	return nil
}

// passed names the limit the run went over, if any: from a watcher, the
// signal that ended the runtime, or the cgroups' counters.
func (rs *runSandbox) passed(res Result) string {
	if v, _ := rs.over.Load().(string); v != "" {
		return v
	}
	switch res.Signal {
	case "SIGXCPU":
		return fmt.Sprintf("cpu_time (%s)", rs.limits.CPUTime)
	case "SIGXFSZ":
		return fmt.Sprintf("file_size (%d bytes)", rs.limits.FileSize)
	}
	for _, dir := range rs.cgroups {
		if b, err := os.ReadFile(filepath.Join(dir, "pids.events")); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 && f[1] != "0" {
				return fmt.Sprintf("processes (%d)", rs.limits.Processes)
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, "memory.failcnt")); err == nil && strings.TrimSpace(string(b)) != "0" {
			return fmt.Sprintf("memory (%d bytes)", rs.limits.Memory)
		}
	}
	return ""
}

// close removes the run's cgroups; the launcher is gone, so are their
// processes.
func (rs *runSandbox) close() {
	if rs == nil {
		return
	}
	for _, dir := range rs.cgroups {
		for range 50 {
			if err := syscall.Rmdir(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
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
