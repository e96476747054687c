package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
)

// Launcher starts runtimes through the launcher. It is safe for concurrent
// use.
type Launcher struct {
	exe  string
	mode Mode
	attr func() *syscall.SysProcAttr
	host Host
}

// New finds the launcher binary (see Executable) and probes the strongest
// containment the host allows: a PID namespace (directly when the worker
// may create one, else inside an unprivileged user namespace that maps the
// worker's own uid), or a subreaper. bin is the launcher binary to use;
// empty means Executable's choice.
func New(bin string) (*Launcher, error) {
	l, err := NewMode(bin, ModePIDNamespace)
	if err == nil {
		return l, nil
	}
	if errors.Is(err, ErrLauncher) {
		return nil, err
	}
	return NewMode(bin, ModeSubreaper)
}

// Executable returns the launcher binary a worker uses when none is
// configured: agora-sandbox next to the running executable when it is
// there (a small binary that starts in about the time of any Go program),
// otherwise the running executable itself, re-executed (it starts slower:
// every package of a large binary initialises first).
func Executable() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), launcher.Name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return "/proc/self/exe"
}

// NewMode is New with the mode chosen by the caller; it fails when the host
// does not allow that mode.
func NewMode(bin string, mode Mode) (*Launcher, error) {
	if bin == "" {
		bin = Executable()
	}
	// The binary must be a launcher of this build: it answers the probe.
	if err := (&exec.Cmd{Path: bin, Args: []string{launcher.ProbeName, launcher.Protocol}}).Run(); err != nil {
		return nil, fmt.Errorf("%w: %s is not a launcher speaking %s (%v)", ErrLauncher, bin, launcher.Protocol, err)
	}
	probe := func(attr *syscall.SysProcAttr) (Host, error) {
		out, err := (&exec.Cmd{Path: bin, Args: []string{launcher.ProbeName, launcher.Protocol}, SysProcAttr: attr}).Output()
		if err != nil {
			return Host{}, err
		}
		var h Host
		_, err = fmt.Sscanf(string(out), "landlock=%d proc=%t", &h.LandlockABI, &h.PrivateProc)
		return h, err
	}
	exe := bin
	l := &Launcher{exe: exe}
	uid, gid := os.Getuid(), os.Getgid()
	candidates := []struct {
		mode Mode
		attr func() *syscall.SysProcAttr
	}{
		{ModePIDNamespace, func() *syscall.SysProcAttr {
			return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
		}},
		{ModePIDNamespace, func() *syscall.SysProcAttr {
			return &syscall.SysProcAttr{
				Setsid: true, Pdeathsig: syscall.SIGKILL,
				Cloneflags:  syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUSER,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
			}
		}},
	}
	switch mode {
	case ModePIDNamespace:
		var errs []error
		for _, c := range candidates {
			h, err := probe(c.attr())
			if err == nil {
				l.mode, l.attr, l.host = c.mode, c.attr, h
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
	h, err := probe(l.attr())
	if err != nil {
		return nil, fmt.Errorf("%w: probe: %v", ErrLauncher, err)
	}
	l.host = h
	return l, nil
}

// Executable reports the launcher binary in use.
func (l *Launcher) Executable() string { return l.exe }

// Host reports what the launcher can apply on this host.
func (l *Launcher) Host() Host { return l.host }

// Mode reports how the launcher contains process trees on this host.
func (l *Launcher) Mode() Mode { return l.mode }

// Run starts s through the launcher and blocks until the runtime and every
// process it started are gone. When ctx ends, the runtime's process group
// gets SIGTERM, and everything is killed after s.KillGrace.
func (l *Launcher) Run(ctx context.Context, s Spec) Result {
	resR, resW, err := os.Pipe()
	if err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: %v", ErrLauncher, err)}
	}
	defer resR.Close()
	// The policy pipe is always passed (empty for none): fd 5 of the
	// launcher must never be some other descriptor.
	polR, polW, err := os.Pipe()
	if err != nil {
		resW.Close()
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: %v", ErrLauncher, err)}
	}
	defer polR.Close()
	// Written whole before the launcher reads it: a policy is far below a
	// pipe's buffer.
	_, err = io.WriteString(polW, s.Policy.Format())
	polW.Close()
	if err != nil {
		resW.Close()
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: policy: %v", ErrLauncher, err)}
	}
	args := append([]string{launcher.Name, launcher.Protocol, strconv.FormatInt(int64(s.KillGrace), 10), s.Path}, s.Args...)
	cmd := &exec.Cmd{
		Path: l.exe, Args: args, Env: s.Env, Dir: s.Dir,
		Stdout: s.Stdout, Stderr: s.Stderr,
		ExtraFiles:  []*os.File{resW, s.Hold, polR},
		SysProcAttr: l.attr(),
		// Output pipes close when the tree is gone; this only bounds a
		// launcher that was killed while something else held them.
		WaitDelay: time.Second,
	}
	err = cmd.Start()
	resW.Close()
	if err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: start: %v", ErrLauncher, err)}
	}
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
	r, err := launcher.Parse(string(b))
	if err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("%w: no report (%v)", ErrLauncher, werr)}
	}
	res := Result{ExitCode: r.ExitCode, Killed: r.Killed, Applied: r.Applied}
	if r.Signal != 0 {
		res.Signal = unix.SignalName(syscall.Signal(r.Signal))
	}
	if r.StartErr != "" {
		res.ExitCode = -1
		res.Err = fmt.Errorf("sandbox: start runtime: %s", r.StartErr)
	}
	return res
}
