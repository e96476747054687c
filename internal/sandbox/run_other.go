//go:build !linux

package sandbox

import (
	"context"
	"errors"
	"os/exec"
	"syscall"
	"time"
)

// Launcher starts runtimes directly in their own process group: other
// platforms have no subreaper or PID namespace (ModeDirect).
type Launcher struct{}

// New returns a direct launcher; the options are ignored.
func New(Options) (*Launcher, error) { return &Launcher{}, nil }

// Executable reports that no launcher binary is used.
func (l *Launcher) Executable() string { return "" }

// NewMode returns a direct launcher when mode is ModeDirect.
func NewMode(_ Options, mode Mode) (*Launcher, error) {
	if mode != ModeDirect {
		return nil, errors.New("sandbox: only the direct mode exists on this platform")
	}
	return &Launcher{}, nil
}

// Host reports that nothing beyond the process group is applied.
func (l *Launcher) Host() Host { return Host{} }

// Mode reports ModeDirect.
func (l *Launcher) Mode() Mode { return ModeDirect }

// UnconfinedMode reports ModeDirect.
func (l *Launcher) UnconfinedMode() Mode { return ModeDirect }

// Run starts s and blocks until it exits; when ctx ends its process group
// gets SIGTERM, then SIGKILL after s.KillGrace.
func (l *Launcher) Run(ctx context.Context, s Spec) Result {
	cmd := &exec.Cmd{Path: s.Path, Args: s.Args, Env: s.Env, Dir: s.Dir, Stdout: s.Stdout, Stderr: s.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true}, WaitDelay: s.KillGrace + time.Second}
	if err := cmd.Start(); err != nil {
		return Result{ExitCode: -1, Err: err}
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(s.KillGrace)
		select {
		case werr = <-done:
			t.Stop()
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			werr = <-done
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	res := Result{ExitCode: cmd.ProcessState.ExitCode()}
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) && !errors.Is(werr, exec.ErrWaitDelay) {
		res.Err = werr
	}
	return res
}

// Close releases nothing: a direct launcher keeps no process started.
func (l *Launcher) Close() {}

// Spawner reports nil: launchers start directly here.
func (l *Launcher) Spawner() error { return nil }
