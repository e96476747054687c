//go:build unix

package worker

import "syscall"

// oNoFollow opens an artifact without following a symlink and without
// blocking on a FIFO.
const oNoFollow = syscall.O_NOFOLLOW | syscall.O_NONBLOCK
