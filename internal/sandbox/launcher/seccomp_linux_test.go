//go:build linux

package launcher

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestSeccompVerdicts runs the assembled filters on system calls, as the
// kernel would run them all and keep the most restrictive answer, and
// checks each verdict. Among them: calls that follow a conditional rule
// which did not match (clone without namespace flags, then socket and
// socketpair with refused arguments), which an assembler that leaves an
// argument in the accumulator lets through.
func TestSeccompVerdicts(t *testing.T) {
	if archName() != "x86_64" {
		t.Skip("the table uses x86_64 system call numbers")
	}
	progs, err := seccompPrograms()
	if err != nil {
		t.Fatal(err)
	}
	var vms []*bpf.VM
	for _, raw := range progs {
		ins, ok := bpf.Disassemble(raw)
		if !ok {
			t.Fatal("a filter does not disassemble")
		}
		vm, err := bpf.NewVM(ins)
		if err != nil {
			t.Fatal(err)
		}
		vms = append(vms, vm)
	}
	const (
		archX86_64 = 0xc000003e
		archI386   = 0x40000003
		allow      = 0x7fff0000
		kill       = 0x80000000
		eperm      = 0x50000 | uint32(unix.EPERM)
		enosys     = 0x50000 | uint32(unix.ENOSYS)
	)
	verdict := func(archID, nr uint32, args ...uint64) uint32 {
		// seccomp_data as the kernel lays it out on a little-endian
		// machine; bpf.VM loads words big-endian, so each word is
		// written so.
		b := make([]byte, 64)
		binary.BigEndian.PutUint32(b[0:], nr)
		binary.BigEndian.PutUint32(b[4:], archID)
		for i, a := range args {
			binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
			binary.BigEndian.PutUint32(b[16+8*i+4:], uint32(a>>32))
		}
		out := uint32(allow)
		for _, vm := range vms {
			r, err := vm.Run(b)
			if err != nil {
				t.Fatal(err)
			}
			if int32(uint32(r)&0xffff0000) < int32(out&0xffff0000) {
				out = uint32(r)
			}
		}
		return out
	}
	const (
		sysSocket     = 41
		sysSocketpair = 53
		sysClone      = 56
	)
	hi := uint64(1) << 32
	for _, c := range []struct {
		name string
		arch uint32
		nr   uint32
		args []uint64
		want uint32
	}{
		{"getpid", archX86_64, 39, nil, allow},
		{"ptrace", archX86_64, 101, nil, eperm},
		{"clone3", archX86_64, 435, nil, enosys},
		{"x32 getpid", archX86_64, 0x40000000 | 39, nil, enosys},
		{"i386 getpid", archI386, 20, nil, kill},
		{"clone plain", archX86_64, sysClone, []uint64{uint64(unix.SIGCHLD)}, allow},
		{"clone with exit signal 41", archX86_64, sysClone, []uint64{41}, allow},
		{"clone with exit signal 53", archX86_64, sysClone, []uint64{53}, allow},
		{"clone NEWUSER", archX86_64, sysClone, []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm},
		{"clone NEWNET", archX86_64, sysClone, []uint64{unix.CLONE_NEWNET}, eperm},
		{"socket unix", archX86_64, sysSocket, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, allow},
		{"socket unix dgram cloexec", archX86_64, sysSocket, []uint64{unix.AF_UNIX, unix.SOCK_DGRAM | unix.SOCK_CLOEXEC, 0}, allow},
		{"socket inet stream", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, allow},
		{"socket inet stream tcp nonblock", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC, unix.IPPROTO_TCP}, allow},
		{"socket inet dgram udp", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDP}, allow},
		{"socket inet6 stream", archX86_64, sysSocket, []uint64{unix.AF_INET6, unix.SOCK_STREAM, 0}, allow},
		{"socket netlink route", archX86_64, sysSocket, []uint64{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE}, allow},
		{"socket inet mptcp", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, eperm},
		{"socket inet6 mptcp", archX86_64, sysSocket, []uint64{unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, eperm},
		{"socket inet mptcp in the high bits", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_STREAM, hi | unix.IPPROTO_MPTCP}, eperm},
		{"socket inet protocol 53", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_STREAM, 53}, eperm},
		{"socket inet raw", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_TCP}, eperm},
		{"socket inet raw icmp", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_RAW, 1}, eperm},
		{"socket inet type 0", archX86_64, sysSocket, []uint64{unix.AF_INET, 0, 0}, eperm},
		{"socket inet seqpacket", archX86_64, sysSocket, []uint64{unix.AF_INET6, unix.SOCK_SEQPACKET, 0}, eperm},
		{"socket inet packet type 10", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_PACKET, 0}, eperm},
		{"socket inet dgram icmp", archX86_64, sysSocket, []uint64{unix.AF_INET, unix.SOCK_DGRAM, 1}, eperm},
		{"socket packet", archX86_64, sysSocket, []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0x300}, eperm},
		{"socket vsock", archX86_64, sysSocket, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, eperm},
		{"socket alg", archX86_64, sysSocket, []uint64{unix.AF_ALG, unix.SOCK_SEQPACKET, 0}, eperm},
		{"socket netlink audit", archX86_64, sysSocket, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT}, eperm},
		{"socket netlink uevent", archX86_64, sysSocket, []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT}, eperm},
		{"socket unix in the high bits", archX86_64, sysSocket, []uint64{hi | unix.AF_UNIX, unix.SOCK_STREAM, 0}, eperm},
		{"socket family 53", archX86_64, sysSocket, []uint64{53, unix.SOCK_STREAM, 0}, eperm},
		{"socketpair unix", archX86_64, sysSocketpair, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, allow},
		{"socketpair inet", archX86_64, sysSocketpair, []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, eperm},
		{"socketpair vsock", archX86_64, sysSocketpair, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, eperm},
	} {
		if got := verdict(c.arch, c.nr, c.args...); got != c.want {
			t.Errorf("%s: verdict %#x, want %#x", c.name, got, c.want)
		}
	}
}

func archName() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Machine[:])
}
