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
// reports what holds, and refuses a run whose floor needs it); a layer
// that exists but fails to apply fails it.
func apply(p Policy, pid1 bool) ([]string, error) {
	applied := []string{"no_new_privs"}
	if inUserNS() {
		applied = append(applied, "userns")
	}
	if len(p.Rlimits) > 0 {
		for name, v := range p.Rlimits {
			if name == "as" {
				continue // set on the runtime itself (limitChild): the launcher's Go runtime already maps more
			}
			if name == "nproc" {
				// The launcher counts among the run's tasks and
				// must still make threads when the run has as many
				// as it may: it keeps some room, and the runtime
				// gets the limit itself (limitChild).
				v += nprocLauncherRoom
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
	switch {
	case p.Root:
		// Built before the receipt (main).
	case pid1:
		// Our own mount namespace: nothing we mount is seen outside.
		if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err == nil {
			// A /proc that shows only this run's processes.
			if syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "") == nil {
				applied = append(applied, "proc")
			}
		}
	}
	// Nothing of the launcher can be traced or read through /proc by a
	// process without CAP_SYS_PTRACE over its namespace.
	if err := prctl(unix.PR_SET_DUMPABLE, 0); err != nil {
		return nil, fmt.Errorf("launcher: non-dumpable: %w", err)
	}
	if p.Landlock {
		abi, err := llsys.LandlockGetABIVersion()
		if err == nil && abi >= 1 {
			// The launcher lists its threads to restrict them all (psx
			// reads /proc/<pid>/task after the first is restricted) and,
			// as a subreaper, its children.
			extra := []string{"/proc/" + strconv.Itoa(os.Getpid()) + "/task"}
			if !pid1 {
				extra = append(extra, "/proc/self/task")
			}
			// Every thread of the launcher, not only the one that forks:
			// the runtime's domain (startRuntime) nests inside this one.
			if err := restrictAll(abi, p, extra...); err != nil {
				return nil, fmt.Errorf("launcher: landlock: %w", err)
			}
			applied = append(applied, "landlock-v"+strconv.Itoa(min(abi, 11)))
		}
	}
	if p.Seccomp {
		if err := loadSeccomp(); err != nil {
			return nil, fmt.Errorf("launcher: %w", err)
		}
		applied = append(applied, "seccomp")
	}
	return applied, nil
}

// nprocLauncherRoom is how many tasks more than the run's process limit
// the launcher itself may have: its own threads.
const nprocLauncherRoom = 32

// limitChild sets the address-space and process limits on the started
// runtime. The address space is set right after the start rather than
// inherited, because the launcher's own Go runtime maps more than a small
// limit allows. RLIMIT_NPROC counts the tasks of the run's uid in the run's
// own user namespace, that is the run's tasks, the launcher's threads
// included: the launcher holds itself, and so what the runtime starts before
// this call, to the limit and nprocLauncherRoom more; the runtime gets the
// limit. The run's cgroup, where there is one, bounds memory and processes
// from the first moment.
func limitChild(p Policy, pid int) error {
	for name, res := range map[string]int{"as": unix.RLIMIT_AS, "nproc": unix.RLIMIT_NPROC} {
		v, ok := p.Rlimits[name]
		if !ok {
			continue
		}
		if err := unix.Prlimit(pid, res, &unix.Rlimit{Cur: v, Max: v}, nil); err != nil {
			return fmt.Errorf("launcher: rlimit %s=%d: %w", name, v, err)
		}
	}
	return nil
}

// probe reports what this host lets a launcher apply, as "landlock=<abi>
// proc=<0|1> userns=<0|1> netns=<0|1> seccomp=<0|1>": the Landlock ABI (0:
// none), whether a fresh /proc could be mounted (only PID 1 of its own
// namespaces can), whether the probe runs in a user namespace of its own
// with a network namespace whose loopback it could bring up, and whether
// this build has a seccomp filter for the architecture.
func probe() string {
	abi, err := llsys.LandlockGetABIVersion()
	if err != nil {
		abi = 0
	}
	proc := os.Getpid() == 1 && syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, "") == nil &&
		syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "") == nil
	userns := inUserNS()
	netns := userns && loopbackUp() == nil
	_, serr := seccompPrograms()
	return "landlock=" + strconv.Itoa(abi) + " proc=" + b(proc) + " userns=" + b(userns) + " netns=" + b(netns) + " seccomp=" + b(serr == nil) + "\n"
}
