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

// restrictThread builds the policy's Landlock ruleset and enforces it on
// the calling thread only. The launcher calls it on its main thread, the
// one it then forks the runtime from: the runtime inherits the thread's
// domain, and the launcher avoids stopping every thread of its Go runtime
// to restrict them all (what go-landlock does on kernels before ABI 8),
// which cost most of a millisecond per run. no_new_privs must already be
// set on the thread. Paths that do not exist are left out; a file given
// as a directory rule gets the rights that apply to files.
func restrictThread(abi int, p Policy, extraRead ...string) error {
	attr := llHandled(abi)
	fd, err := llsys.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		return fmt.Errorf("landlock_create_ruleset: %w", err)
	}
	defer syscall.Close(fd)
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
		return fmt.Errorf("landlock_add_rule: %w", err)
	}
	if attr.HandledAccessNet != 0 {
		for _, port := range p.TCPConnect {
			if err := llsys.LandlockAddNetPortRule(fd, &llsys.NetPortAttr{AllowedAccess: llsys.AccessNetConnectTCP, Port: uint64(port)}, 0); err != nil {
				return fmt.Errorf("landlock_add_rule: port %d: %w", port, err)
			}
		}
	}
	if err := llsys.LandlockRestrictSelf(fd, 0); err != nil {
		return fmt.Errorf("landlock_restrict_self: %w", err)
	}
	return nil
}
