//go:build !linux

package chaos

import "golang.org/x/sys/unix"

// detach unmounts the filesystem on path, by force.
func detach(path string) { _ = unix.Unmount(path, unix.MNT_FORCE) }
