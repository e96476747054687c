//go:build linux

package worker

import "golang.org/x/sys/unix"

// mountTmpfs mounts a tmpfs with opts on dir (the workspace's own
// filesystem, sandbox.go).
func mountTmpfs(dir, opts string) error {
	return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts)
}

// detach unmounts what is mounted on dir, if anything, lazily.
func detach(dir string) { _ = unix.Unmount(dir, unix.MNT_DETACH) }

// fsFull reports whether the filesystem at dir has (all but) no room or
// no inode left.
func fsFull(dir string) bool {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return false
	}
	return st.Bavail*uint64(st.Bsize) < 64<<10 || st.Ffree == 0
}
