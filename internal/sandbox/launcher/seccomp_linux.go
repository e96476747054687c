//go:build linux

package launcher

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The run's seccomp filter: its rules and their assembly are in
// seccompgen (docs/sandbox.md, "seccomp"); seccompPrograms gives the
// assembled programs, from a table made ahead of time where the build has
// one (seccomp_table_linux_amd64.go), else assembled now.

// loadSeccomp installs the filter on every thread of the process
// (SECCOMP_FILTER_FLAG_TSYNC); children inherit it. no_new_privs must be
// set on the calling thread (TSYNC then sets it on the others).
func loadSeccomp() error {
	progs, err := seccompPrograms()
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	for _, raw := range progs {
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
	}
	return nil
}
