//go:build unix

package sentinel

import "syscall"

// openFlags opens the sentinel without following a symlink and without
// blocking should a FIFO have been swapped in after the type check.
const openFlags = syscall.O_RDONLY | syscall.O_NOFOLLOW | syscall.O_NONBLOCK
