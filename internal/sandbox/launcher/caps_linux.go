//go:build linux

package launcher

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// dropThreadCaps empties every capability set of the calling thread:
// bounding (which needs CAP_SETPCAP, so first), ambient, then effective,
// permitted and inheritable. The runtime, forked from this thread and
// exec'd as a user that is not root in its namespace, starts with all five
// empty (docs/sandbox.md, "No privilege"). A launcher without CAP_SETPCAP
// (one in a user namespace that maps the worker's own uid, for a run
// without a sandbox) has nothing to drop but its bounding set, which it
// cannot: it reports full false and drops the rest.
func dropThreadCaps() (full bool, err error) {
	full = true
	last := lastCap()
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err == unix.EPERM {
			full = false
			break
		} else if err != nil && err != unix.EINVAL {
			return false, fmt.Errorf("capabilities: drop %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return false, fmt.Errorf("capabilities: clear ambient: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capabilities: capset: %w", err)
	}
	return full, nil
}

// lastCap is the kernel's highest capability number.
func lastCap() int {
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return n
		}
	}
	return 63
}
