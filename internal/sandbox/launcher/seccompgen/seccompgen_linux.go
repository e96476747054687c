//go:build linux

// Package seccompgen assembles the run's seccomp filter with
// github.com/elastic/go-seccomp-bpf. The launcher loads it; on amd64 it
// loads a table assembled from this package ahead of time, so that the
// launcher, a process started for every run, neither links the library
// nor assembles the filter again (docs/sandbox.md, "seccomp").
package seccompgen

import (
	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The run's seccomp filter (docs/sandbox.md, "seccomp"). It allows by
// default and refuses, with EPERM so that tools degrade rather than die,
// what a sub-agent never needs and an attacker reaches for: tracing and
// reading other processes, kernel keyrings, BPF and perf, io_uring (its
// IORING_OP_SOCKET would pass the socket rules), the mount API and new
// namespaces, module loading and the like. clone3 answers ENOSYS (its flags
// sit in memory a filter cannot read; the C library then falls back to
// clone, whose flags it can). socket() is allowed only for AF_UNIX, for
// AF_INET and AF_INET6 streams and datagrams of protocol 0, TCP or UDP
// (no raw, packet or multipath TCP sockets), and for NETLINK_ROUTE (the
// C library's getaddrinfo asks it which address families exist; in the
// run's own network namespace it sees only loopback). A system call of
// another architecture (the 32-bit ABI through int 0x80) kills the
// process: the rules name this architecture's numbers only.

// deniedSyscalls answer EPERM. Names this architecture lacks are skipped.
var deniedSyscalls = []string{
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
	"perf_event_open", "bpf", "userfaultfd",
	"keyctl", "add_key", "request_key",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd",
	"lookup_dcookie", "open_by_handle_at", "iopl", "ioperm", "syslog", "vhangup", "uselib",
	"fanotify_init", "nfsservctl",
}

// namespaceFlags are clone's flags that make a namespace.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// policies builds the filter's rules for an architecture ("" for the
// running one),
// as several programs the kernel runs in turn (the most restrictive answer
// wins). Each program holds at most one rule with argument conditions, and
// holds it last: the assembler leaves an argument, not the system call
// number, in the accumulator once a conditional rule does not match, so a
// rule after it would compare that argument with system call numbers and
// let the call through (docs/sandbox.md, "Attack → layer → test"). The
// socket rules are therefore written as the calls to refuse.
func policies(archName string) ([]seccomp.Policy, *arch.Info, error) {
	info, err := arch.GetInfo(archName)
	if err != nil {
		return nil, nil, err
	}
	var denied []string
	for _, n := range deniedSyscalls {
		if _, ok := info.SyscallNames[n]; ok {
			denied = append(denied, n)
		}
	}
	// Comparisons are of all 64 bits: an argument with high bits set
	// (which the kernel drops when it reads an int) never equals an
	// allowed value, so it is refused.
	eq := func(arg uint32, v uint64) seccomp.Condition {
		return seccomp.Condition{Argument: arg, Operation: seccomp.Equal, Value: v}
	}
	ne := func(arg uint32, v uint64) seccomp.Condition {
		return seccomp.Condition{Argument: arg, Operation: seccomp.NotEqual, Value: v}
	}
	bits := func(arg uint32, v uint64) seccomp.Condition {
		return seccomp.Condition{Argument: arg, Operation: seccomp.BitsSet, Value: v}
	}
	// socket() is refused for a family other than AF_UNIX, AF_INET,
	// AF_INET6 and AF_NETLINK; for netlink other than NETLINK_ROUTE; for
	// AF_INET and AF_INET6 with a protocol other than 0, TCP and UDP, or a
	// type whose low four bits are not SOCK_STREAM or SOCK_DGRAM (the
	// flags SOCK_NONBLOCK and SOCK_CLOEXEC sit above them).
	socketDenied := []seccomp.ArgumentConditions{
		{ne(0, unix.AF_UNIX), ne(0, unix.AF_INET), ne(0, unix.AF_INET6), ne(0, unix.AF_NETLINK)},
		{eq(0, unix.AF_NETLINK), ne(2, unix.NETLINK_ROUTE)},
	}
	for _, family := range []uint64{unix.AF_INET, unix.AF_INET6} {
		socketDenied = append(socketDenied,
			seccomp.ArgumentConditions{eq(0, family), ne(2, 0), ne(2, unix.IPPROTO_TCP), ne(2, unix.IPPROTO_UDP)},
			seccomp.ArgumentConditions{eq(0, family), bits(1, 0xc)},                                             // type 4 to 15
			seccomp.ArgumentConditions{eq(0, family), {Argument: 1, Operation: seccomp.BitsNotSet, Value: 0x3}}, // type 0
			seccomp.ArgumentConditions{eq(0, family), bits(1, unix.SOCK_STREAM), bits(1, unix.SOCK_DGRAM)},      // type 3, SOCK_RAW
		)
	}
	errno := func(e unix.Errno) seccomp.Action { return seccomp.ActionErrno | seccomp.Action(e) }
	policy := func(groups ...seccomp.SyscallGroup) seccomp.Policy {
		return seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: groups}
	}
	return []seccomp.Policy{
		policy(
			seccomp.SyscallGroup{Names: denied, Action: errno(unix.EPERM)},
			seccomp.SyscallGroup{Names: []string{"clone3"}, Action: errno(unix.ENOSYS)},
			seccomp.SyscallGroup{NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "clone", Conditions: seccomp.ArgumentConditions{bits(0, namespaceFlags)}},
			}, Action: errno(unix.EPERM)},
		),
		policy(seccomp.SyscallGroup{NamesWithCondtions: withEach("socket", socketDenied), Action: errno(unix.EPERM)}),
		policy(seccomp.SyscallGroup{NamesWithCondtions: []seccomp.NameWithConditions{
			{Name: "socketpair", Conditions: seccomp.ArgumentConditions{ne(0, unix.AF_UNIX)}},
		}, Action: errno(unix.EPERM)}),
	}, info, nil
}

// withEach makes one NameWithConditions per alternative: the group
// matches when any alternative's conditions all hold.
func withEach(name string, alts []seccomp.ArgumentConditions) []seccomp.NameWithConditions {
	out := make([]seccomp.NameWithConditions, len(alts))
	for i, c := range alts {
		out[i] = seccomp.NameWithConditions{Name: name, Conditions: c}
	}
	return out
}

// Programs assembles the filters for an architecture ("" for the running
// one, as the kernel names it: x86_64, aarch64, …), each led by an
// architecture check that kills a process calling through another ABI (the
// library's own check would send it to the default action: allow). The
// argument values (address families, socket types, clone flags) are this
// build's: assemble for the architecture the build is for.
func Programs(archName string) ([][]bpf.RawInstruction, error) {
	pols, info, err := policies(archName)
	if err != nil {
		return nil, err
	}
	var progs [][]bpf.RawInstruction
	for _, pol := range pols {
		body, err := pol.Assemble()
		if err != nil {
			return nil, err
		}
		const archOffset = 4 // seccomp_data.arch
		prog, err := bpf.Assemble(append([]bpf.Instruction{
			bpf.LoadAbsolute{Off: archOffset, Size: 4},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
			bpf.RetConstant{Val: uint32(seccomp.ActionKillProcess)},
		}, body...))
		if err != nil {
			return nil, err
		}
		progs = append(progs, prog)
	}
	return progs, nil
}
