package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// probeName is argv[0] of a launcher started only to learn which mode the
// host allows; it exits at once.
const probeName = "agora-sandbox-probe"

func init() {
	if len(os.Args) > 0 && os.Args[0] == probeName {
		os.Exit(0)
	}
}

// Launcher starts runtimes through the launcher. It is safe for concurrent
// use.
type Launcher struct {
	exe  string
	mode Mode
	attr func() *syscall.SysProcAttr
}

// New finds the running executable and probes the strongest containment
// the host allows: a PID namespace (directly when the worker may create
// one, else inside an unprivileged user namespace that maps the worker's
// own uid), or a subreaper.
func New() (*Launcher, error) {
	l, err := NewMode(ModePIDNamespace)
	if err == nil {
		return l, nil
	}
	return NewMode(ModeSubreaper)
}

// NewMode is New with the mode chosen by the caller; it fails when the host
// does not allow that mode.
func NewMode(mode Mode) (*Launcher, error) {
	exe := "/proc/self/exe"
	if _, err := os.Stat(exe); err != nil {
		return nil, fmt.Errorf("sandbox: the launcher re-executes the worker binary: %w", err)
	}
	l := &Launcher{exe: exe}
	uid, gid := os.Getuid(), os.Getgid()
	candidates := []struct {
		mode Mode
		attr func() *syscall.SysProcAttr
	}{
		{ModePIDNamespace, func() *syscall.SysProcAttr {
			return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWPID}
		}},
		{ModePIDNamespace, func() *syscall.SysProcAttr {
			return &syscall.SysProcAttr{
				Setsid: true, Pdeathsig: syscall.SIGKILL,
				Cloneflags:  syscall.CLONE_NEWPID | syscall.CLONE_NEWUSER,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
			}
		}},
	}
	switch mode {
	case ModePIDNamespace:
		var errs []error
		for _, c := range candidates {
			cmd := &exec.Cmd{Path: exe, Args: []string{probeName}, SysProcAttr: c.attr()}
			err := cmd.Run()
			if err == nil {
				l.mode, l.attr = c.mode, c.attr
				return l, nil
			}
			errs = append(errs, err)
		}
		return nil, fmt.Errorf("sandbox: no PID namespace on this host (%w)", errors.Join(errs...))
	case ModeSubreaper:
	default:
		return nil, fmt.Errorf("sandbox: mode %q is not available on Linux", mode)
	}
	l.mode = ModeSubreaper
	l.attr = func() *syscall.SysProcAttr {
		// SIGHUP, not SIGKILL: the launcher must live to kill its tree.
		return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGHUP}
	}
	return l, nil
}

// Mode reports how the launcher contains process trees on this host.
func (l *Launcher) Mode() Mode { return l.mode }

// Run starts s through the launcher and blocks until the runtime and every
// process it started are gone. When ctx ends, the runtime's process group
// gets SIGTERM, and everything is killed after s.KillGrace.
func (l *Launcher) Run(ctx context.Context, s Spec) Result {
	specR, specW, err := os.Pipe()
	if err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: %v", ErrLauncher, err)}
	}
	resR, resW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: %v", ErrLauncher, err)}
	}
	defer resR.Close()
	cmd := &exec.Cmd{
		Path: l.exe, Args: []string{launcherName}, Env: s.Env, Dir: s.Dir,
		Stdout: s.Stdout, Stderr: s.Stderr,
		ExtraFiles:  []*os.File{specR, resW, s.Hold},
		SysProcAttr: l.attr(),
		// Output pipes close when the tree is gone; this only bounds a
		// launcher that was killed while something else held them.
		WaitDelay: time.Second,
	}
	err = cmd.Start()
	specR.Close()
	resW.Close()
	if err != nil {
		specW.Close()
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: start: %v", ErrLauncher, err)}
	}
	_ = json.NewEncoder(specW).Encode(spec{Path: s.Path, Args: s.Args, KillGrace: s.KillGrace})
	specW.Close()

	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(s.KillGrace + 2*time.Second)
		select {
		case werr = <-done:
			t.Stop()
		case <-t.C:
			// The launcher did not end its tree in time. In a PID
			// namespace its death takes the tree with it.
			_ = cmd.Process.Kill()
			werr = <-done
		}
	}
	b, _ := io.ReadAll(io.LimitReader(resR, 64<<10))
	var r report
	if len(b) == 0 || json.Unmarshal(b, &r) != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: no report (%v)", ErrLauncher, werr)}
	}
	return r.result()
}
