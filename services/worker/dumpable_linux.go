package worker

import "syscall"

// nonDumpable sets PR_SET_DUMPABLE 0 on the worker process.
func nonDumpable() error {
	const prSetDumpable = 4
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); e != 0 {
		return e
	}
	return nil
}
