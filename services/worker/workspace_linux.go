package worker

import (
	"errors"

	"golang.org/x/sys/unix"
)

// renameNoReplace renames from to to, failing when to exists (a plain
// rename would replace an empty directory).
func renameNoReplace(from, to string) error {
	return unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
}

// noXattrs reports whether path (not followed) has no extended attributes.
func noXattrs(path string) bool {
	n, err := unix.Llistxattr(path, nil)
	if errors.Is(err, unix.ENOTSUP) {
		return true // none on this file system
	}
	return err == nil && n == 0
}
