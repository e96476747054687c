package sandbox

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The launcher's inherited descriptors (set by Launcher.Run).
const (
	fdSpec   = 3 // read: the JSON spec, then EOF
	fdResult = 4 // write: the JSON report, written once before exit
	fdHold   = 5 // optional: kept open until the tree is gone
)

func init() {
	if len(os.Args) > 0 && os.Args[0] == launcherName {
		os.Exit(launch())
	}
}

// launch is the launcher's main. Its exit code only matters when it could
// not write a report: the worker reads how the runtime ended from the
// result pipe.
func launch() int {
	// Nothing but stdin, stdout and stderr reaches the runtime: not our
	// pipes or the hold descriptor, and not descriptors the worker itself
	// inherited without close-on-exec.
	closeInherited()
	out := os.NewFile(fdResult, "result")
	fail := func(err error) int {
		_ = json.NewEncoder(out).Encode(report{ExitCode: -1, StartErr: err.Error()})
		return 0
	}
	var sp spec
	in := os.NewFile(fdSpec, "spec")
	err := json.NewDecoder(in).Decode(&sp)
	in.Close()
	if err != nil {
		return fail(err)
	}
	pid1 := os.Getpid() == 1
	if !pid1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fail(err)
		}
	}
	// No setuid or file-capability binary can give the tree more
	// privileges than the worker started it with.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail(err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)

	cmd := &exec.Cmd{
		Path: sp.Path, Args: sp.Args, Env: os.Environ(),
		Stdin: nil, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	var grace <-chan time.Time
	stopping := false
wait:
	for {
		select {
		case <-done:
			break wait
		case s := <-sigs:
			if s == syscall.SIGTERM && !stopping {
				// The worker asks for a stop: the runtime's group gets
				// SIGTERM and the grace period to end.
				stopping = true
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
				grace = time.After(sp.KillGrace)
				continue
			}
			// SIGHUP is the parent-death signal: the worker is gone, so
			// is everything it started. (Reaping waits until the runtime
			// itself has been waited for.)
			signalTree(pid1, cmd.Process.Pid)
		case <-grace:
			signalTree(pid1, cmd.Process.Pid)
		}
	}
	rep := report{ExitCode: cmd.ProcessState.ExitCode()}
	if cmd.ProcessState != nil {
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			rep.Signal = unix.SignalName(ws.Signal())
		}
	}
	rep.Killed = killTree(pid1, cmd.Process.Pid)
	_ = json.NewEncoder(out).Encode(rep)
	return 0
}

// closeInherited marks every descriptor above stderr close-on-exec.
func closeInherited() {
	if unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// signalTree sends SIGKILL to every process of the tree it can name now,
// without reaping any.
func signalTree(pid1 bool, pgid int) {
	if pid1 {
		_ = syscall.Kill(-1, syscall.SIGKILL)
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	for _, p := range children() {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// killTree kills every process the launcher is responsible for and reaps
// them, returning how many it killed; it runs after the runtime itself has
// been waited for. As PID 1 of its own namespace, kill(-1) reaches every
// other process in it. As a subreaper, it kills the runtime's process
// group, then whatever is re-parented to it, until it has no child left.
func killTree(pid1 bool, pgid int) int {
	killed := 0
	if pid1 {
		_ = syscall.Kill(-1, syscall.SIGKILL)
		for {
			if _, err := syscall.Wait4(-1, nil, 0, nil); errors.Is(err, syscall.ECHILD) {
				return killed
			} else if err == nil {
				killed++
			}
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	seen := map[int]bool{}
	for range 10000 {
		kids := children()
		for _, p := range kids {
			if syscall.Kill(p, syscall.SIGKILL) == nil && !seen[p] {
				seen[p] = true
				killed++
			}
		}
		// Reap what has died; a killed child's own children are
		// re-parented to us and show up in the next round.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.ECHILD) {
				return killed
			}
			if err != nil || pid <= 0 {
				break
			}
		}
		if len(kids) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return killed
}

// children lists the launcher's living child processes, from
// /proc/self/task/*/children (every thread's children).
func children() []int {
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for f := range strings.FieldsSeq(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}
