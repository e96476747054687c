//go:build !linux

package worker

import "syscall"

// sysProcAttr puts the runtime in its own process group, so a stop reaches
// everything it started.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
