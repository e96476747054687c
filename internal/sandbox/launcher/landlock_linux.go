//go:build linux

package launcher

import (
	"errors"
	"fmt"
	"syscall"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Access rights, as go-landlock groups them for its RODirs, RWDirs,
// ROFiles and RWFiles rules.
const (
	llRead  = llsys.AccessFSExecute | llsys.AccessFSReadFile | llsys.AccessFSReadDir
	llWrite = llsys.AccessFSWriteFile | llsys.AccessFSRemoveDir | llsys.AccessFSRemoveFile |
		llsys.AccessFSMakeChar | llsys.AccessFSMakeDir | llsys.AccessFSMakeReg | llsys.AccessFSMakeSock |
		llsys.AccessFSMakeFifo | llsys.AccessFSMakeBlock | llsys.AccessFSMakeSym | llsys.AccessFSTruncate
	// llFile are the rights that apply to a file (not a directory).
	llFile = llsys.AccessFSExecute | llsys.AccessFSWriteFile | llsys.AccessFSTruncate | llsys.AccessFSReadFile
)

// llHandled is what a ruleset handles on a kernel of Landlock ABI abi:
// every filesystem right the ABI knows, TCP connect (not bind: a sub-agent
// may run a local server) and the signal and abstract-socket scopes.
// (Kernel documentation, "Landlock: unprivileged access control", ABI
// versions; the same table as go-landlock's.)
func llHandled(abi int) llsys.RulesetAttr {
	var a llsys.RulesetAttr
	switch {
	case abi >= 9:
		a.HandledAccessFS = 1<<17 - 1 // + resolve_unix
	case abi >= 5:
		a.HandledAccessFS = 1<<16 - 1 // + ioctl_dev
	case abi >= 3:
		a.HandledAccessFS = 1<<15 - 1 // + truncate
	case abi >= 2:
		a.HandledAccessFS = 1<<14 - 1 // + refer
	case abi >= 1:
		a.HandledAccessFS = 1<<13 - 1
	}
	if abi >= 4 {
		a.HandledAccessNet = llsys.AccessNetConnectTCP
	}
	if abi >= 6 {
		a.Scoped = llsys.ScopeAbstractUnixSocket | llsys.ScopeSignal
	}
	return a
}

// restrictThread enforces the policy's Landlock ruleset on the calling
// thread only: the launcher calls it on the thread it forks the runtime
// from, after restrictAll, so the runtime's domain is a child of the
// launcher's — with the signal scope, the runtime cannot signal its
// launcher. no_new_privs must already be set on the thread.
func restrictThread(abi int, p Policy, extraRead ...string) error {
	fd, err := ruleset(abi, p, true, extraRead...)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := llsys.LandlockRestrictSelf(fd, 0); err != nil {
		return fmt.Errorf("landlock_restrict_self: %w", err)
	}
	return nil
}

// restrictAll enforces the policy's Landlock ruleset and no_new_privs on
// every thread of the launcher (through psx on kernels before Landlock ABI
// 8, which stops each thread to run the call on it): no thread of the
// launcher is left outside the run's domain for the runtime to reach.
func restrictAll(abi int, p Policy, extraRead ...string) error {
	// Unscoped: the launcher must signal the runtime's tree, whose domain
	// need not be nested in this one (a Go thread made from one psx did
	// not reach starts outside it).
	fd, err := ruleset(abi, p, false, extraRead...)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := llsys.AllThreadsPrctl(prSetNoNewPrivs, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs on every thread: %w", err)
	}
	if err := llsys.AllThreadsLandlockRestrictSelf(fd, 0); err != nil {
		return fmt.Errorf("landlock_restrict_self on every thread: %w", err)
	}
	return nil
}

// ruleset builds the policy's Landlock ruleset and returns its descriptor;
// scoped adds the signal and abstract-socket scopes. Paths that do not
// exist are left out; a file given as a directory rule gets the rights
// that apply to files.
func ruleset(abi int, p Policy, scoped bool, extraRead ...string) (int, error) {
	attr := llHandled(abi)
	if !scoped {
		attr.Scoped = 0
	}
	fd, err := llsys.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		return -1, fmt.Errorf("landlock_create_ruleset: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			syscall.Close(fd)
		}
	}()
	add := func(paths []string, rights uint64) error {
		for _, path := range paths {
			pfd, err := syscall.Open(path, unix.O_PATH|syscall.O_CLOEXEC, 0)
			if errors.Is(err, syscall.ENOENT) {
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			var st syscall.Stat_t
			err = syscall.Fstat(pfd, &st)
			r := rights & attr.HandledAccessFS
			if err == nil && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
				r &= llFile | llsys.AccessFSIoctlDev
			}
			if err == nil && r != 0 {
				err = llsys.LandlockAddPathBeneathRule(fd, &llsys.PathBeneathAttr{ParentFd: pfd, AllowedAccess: r}, 0)
			}
			syscall.Close(pfd)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
		return nil
	}
	if err := errors.Join(
		add(p.ReadDirs, llRead),
		add(extraRead, llRead),
		add(p.WriteDirs, llRead|llWrite),
		add(p.ReadFiles, llRead&llFile),
		add(p.WriteFiles, (llRead|llWrite)&llFile|llsys.AccessFSIoctlDev),
	); err != nil {
		return -1, fmt.Errorf("landlock_add_rule: %w", err)
	}
	if attr.HandledAccessNet != 0 {
		for _, port := range p.TCPConnect {
			if err := llsys.LandlockAddNetPortRule(fd, &llsys.NetPortAttr{AllowedAccess: llsys.AccessNetConnectTCP, Port: uint64(port)}, 0); err != nil {
				return -1, fmt.Errorf("landlock_add_rule: port %d: %w", port, err)
			}
		}
	}
	ok = true
	return fd, nil
}
