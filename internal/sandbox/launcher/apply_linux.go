//go:build linux

package launcher

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// apply puts the policy's layers in place on the launcher itself, so the
// runtime it starts next inherits them, and names what it applied. A layer
// the host lacks is left out rather than failing the run (the worker
// reports what holds); a layer that exists but fails to apply fails it.
func apply(p Policy, pid1 bool) ([]string, error) {
	applied := []string{"no_new_privs"}
	for _, procs := range p.Cgroups {
		if err := os.WriteFile(procs, []byte("0"), 0); err != nil {
			return nil, fmt.Errorf("launcher: join cgroup %s: %w", procs, err)
		}
	}
	if len(p.Cgroups) > 0 {
		applied = append(applied, "cgroup")
	}
	if pid1 {
		// Our own mount namespace: nothing we mount is seen outside.
		if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err == nil {
			// A /proc that shows only this run's processes.
			if syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "") == nil {
				applied = append(applied, "proc")
			}
		}
	}
	if len(p.Rlimits) > 0 {
		for name, v := range p.Rlimits {
			if name == "as" {
				continue // set on the runtime itself (limitChild): the launcher's Go runtime already maps more
			}
			res, ok := map[string]int{"as": unix.RLIMIT_AS, "nproc": unix.RLIMIT_NPROC, "nofile": unix.RLIMIT_NOFILE, "fsize": unix.RLIMIT_FSIZE, "cpu": unix.RLIMIT_CPU}[name]
			if !ok {
				return nil, fmt.Errorf("launcher: unknown rlimit %q", name)
			}
			if err := unix.Setrlimit(res, &unix.Rlimit{Cur: v, Max: v}); err != nil {
				return nil, fmt.Errorf("launcher: rlimit %s=%d: %w", name, v, err)
			}
		}
		applied = append(applied, "rlimits")
	}
	if p.Landlock {
		abi, err := llsys.LandlockGetABIVersion()
		if err != nil || abi < 1 {
			return applied, nil // no Landlock on this host: reported by the worker's probe
		}
		var extra []string
		if !pid1 {
			// The launcher itself must still list its children.
			extra = append(extra, "/proc/self/task")
		}
		if err := restrictThread(abi, p, extra...); err != nil {
			return nil, fmt.Errorf("launcher: landlock: %w", err)
		}
		applied = append(applied, "landlock-v"+strconv.Itoa(min(abi, 11)))
	}
	return applied, nil
}

// limitChild sets the address-space limit on the started runtime. It is
// set right after the start rather than inherited, because the launcher's
// own Go runtime maps more address space than a small limit allows; the
// run's cgroup, where there is one, bounds memory from the first moment.
func limitChild(p Policy, pid int) error {
	v, ok := p.Rlimits["as"]
	if !ok {
		return nil
	}
	return unix.Prlimit(pid, unix.RLIMIT_AS, &unix.Rlimit{Cur: v, Max: v}, nil)
}

// probe reports what this host lets a launcher apply, as "landlock=<abi>
// proc=<0|1>": the Landlock ABI (0: none) and whether a fresh /proc could
// be mounted (only PID 1 of its own namespaces can).
func probe() string {
	abi, err := llsys.LandlockGetABIVersion()
	if err != nil {
		abi = 0
	}
	proc := 0
	if os.Getpid() == 1 && syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, "") == nil &&
		syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "") == nil {
		proc = 1
	}
	return "landlock=" + strconv.Itoa(abi) + " proc=" + strconv.Itoa(proc) + "\n"
}
