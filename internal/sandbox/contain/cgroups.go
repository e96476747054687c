package contain

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Per-run cgroups (docs/sandbox.md, "Limits"): cgroup v1 pids and memory
// under agora/<worker>-<n>, where the worker may make them (as root in a
// container). The launcher is put in them before the run starts, so the
// runtime and all it starts are bounded as a whole.

var cgroupV1Roots = []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory"}

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

// makeCgroups gives the run a cgroup of the host's pool (v1 pids and
// memory, one directory per hierarchy) with the run's limits; the launcher
// joins them before it starts the runtime.
func (b *Box) makeCgroups() error {
	set, err := b.host.pool.take()
	if err != nil {
		return fmt.Errorf("sandbox: cgroup: %w", err)
	}
	b.cgset = set
	for _, dir := range set.dirs {
		var file, value string
		switch {
		case strings.Contains(dir, "/pids/") && b.limits.Processes > 0:
			file, value = "pids.max", strconv.FormatInt(b.limits.Processes, 10)
		case strings.Contains(dir, "/memory/") && b.limits.Memory > 0:
			file, value = "memory.limit_in_bytes", strconv.FormatInt(b.limits.Memory, 10)
			_ = os.WriteFile(filepath.Join(dir, "memory.failcnt"), []byte("0"), 0)
		}
		if file != "" {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
				return fmt.Errorf("sandbox: cgroup %s: %w", file, err)
			}
		}
		b.cgroups = append(b.cgroups, filepath.Join(dir, "cgroup.procs"))
	}
	set.pidsMax = pidsEvents(set)
	return nil
}

// Exceeded names the limit a run went over that the box itself sees —
// the signal that ended the runtime (signal, "" when none), or the
// cgroups' counters — with its value, as a failed event's detail names
// it; "" when none. A workspace_size passed is the worker's to see.
func (b *Box) Exceeded(signal string) string {
	switch signal {
	case "SIGXCPU":
		return fmt.Sprintf("cpu_time (%s)", b.limits.CPUTime)
	case "SIGXFSZ":
		return fmt.Sprintf("file_size (%d bytes)", b.limits.FileSize)
	}
	if set := b.cgset; set != nil {
		if pidsEvents(set) > set.pidsMax {
			return fmt.Sprintf("processes (%d)", b.limits.Processes)
		}
		for _, dir := range set.dirs {
			if n, err := os.ReadFile(filepath.Join(dir, "memory.failcnt")); err == nil && strings.TrimSpace(string(n)) != "0" {
				return fmt.Sprintf("memory (%d bytes)", b.limits.Memory)
			}
		}
	}
	return ""
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
