package chaos

import "golang.org/x/sys/unix"

// detach unmounts the filesystem on path lazily, busy or not.
func detach(path string) { _ = unix.Unmount(path, unix.MNT_DETACH) }
