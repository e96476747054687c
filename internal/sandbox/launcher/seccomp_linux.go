//go:build linux

package launcher

import (
	"fmt"
	"unsafe"

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

// seccompPolicy builds the filter's rules for the running architecture.
func seccompPolicy() (seccomp.Policy, *arch.Info, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return seccomp.Policy{}, nil, err
	}
	var denied []string
	for _, n := range deniedSyscalls {
		if _, ok := info.SyscallNames[n]; ok {
			denied = append(denied, n)
		}
	}
	eq := func(arg uint32, v uint64) seccomp.Condition {
		return seccomp.Condition{Argument: arg, Operation: seccomp.Equal, Value: v}
	}
	socketOK := []seccomp.ArgumentConditions{
		{eq(0, unix.AF_UNIX)},
		{eq(0, unix.AF_NETLINK), eq(2, unix.NETLINK_ROUTE)},
	}
	for _, family := range []uint64{unix.AF_INET, unix.AF_INET6} {
		for _, proto := range []uint64{0, unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			for _, typ := range []uint64{unix.SOCK_STREAM, unix.SOCK_DGRAM} {
				// The type's low four bits are exactly typ (the
				// flags SOCK_NONBLOCK and SOCK_CLOEXEC sit above).
				socketOK = append(socketOK, seccomp.ArgumentConditions{
					eq(0, family), eq(2, proto),
					{Argument: 1, Operation: seccomp.BitsSet, Value: typ},
					{Argument: 1, Operation: seccomp.BitsNotSet, Value: 0xf &^ typ},
				})
			}
		}
	}
	errno := func(e unix.Errno) seccomp.Action { return seccomp.ActionErrno | seccomp.Action(e) }
	pol := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Names: denied, Action: errno(unix.EPERM)},
			{Names: []string{"clone3"}, Action: errno(unix.ENOSYS)},
			{NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: namespaceFlags}}},
			}, Action: errno(unix.EPERM)},
			{NamesWithCondtions: withEach("socket", socketOK), Action: seccomp.ActionAllow},
			{NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "socketpair", Conditions: seccomp.ArgumentConditions{eq(0, unix.AF_UNIX)}},
			}, Action: seccomp.ActionAllow},
			{Names: []string{"socket", "socketpair"}, Action: errno(unix.EPERM)},
		},
	}
	return pol, info, nil
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

// seccompProgram assembles the filter, led by an architecture check that
// kills a process calling through another ABI (the library's own check
// would send it to the default action: allow).
func seccompProgram() ([]bpf.RawInstruction, error) {
	pol, info, err := seccompPolicy()
	if err != nil {
		return nil, err
	}
	body, err := pol.Assemble()
	if err != nil {
		return nil, err
	}
	const archOffset = 4 // seccomp_data.arch
	prog := append([]bpf.Instruction{
		bpf.LoadAbsolute{Off: archOffset, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: uint32(seccomp.ActionKillProcess)},
	}, body...)
	return bpf.Assemble(prog)
}

// loadSeccomp installs the filter on every thread of the process
// (SECCOMP_FILTER_FLAG_TSYNC); children inherit it. no_new_privs must be
// set on the calling thread (TSYNC then sets it on the others).
func loadSeccomp() error {
	raw, err := seccompProgram()
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, in := range raw {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	r, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	if e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: thread %d could not be synchronised", r)
	}
	return nil
}
