//go:build linux

package launcher

import (
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Inherited descriptors.
const (
	fdResult = 3
	fdHold   = 4
	fdPolicy = 5
)

const (
	prSetChildSubreaper = 36
	prSetNoNewPrivs     = 38
	sysCloseRange       = 436 // the same number on every Linux architecture
	closeRangeCloexec   = 1 << 2
)

func init() {
	if len(os.Args) == 0 {
		return
	}
	switch os.Args[0] {
	case ProbeName:
		if len(os.Args) > 1 && os.Args[1] == Protocol {
			os.Stdout.WriteString(probe())
			os.Exit(0)
		}
		os.Exit(3)
	case Name:
		os.Exit(main())
	}
}

func main() int {
	out := os.NewFile(fdResult, "result")
	report := func(r Result) int {
		_, _ = out.WriteString(r.Format())
		return 0
	}
	fail := func(err error) int { return report(Result{ExitCode: -1, StartErr: err.Error()}) }
	if len(os.Args) < 5 || os.Args[1] != Protocol {
		return fail(errors.New("launcher: this launcher does not speak " + Protocol + ": use the agora-sandbox of the worker's own build"))
	}
	grace, err := strconv.ParseInt(os.Args[2], 10, 64)
	if err != nil {
		return fail(err)
	}
	path, argv := os.Args[3], os.Args[4:]

	f := os.NewFile(fdPolicy, "policy")
	pol, err := ParsePolicy(f)
	f.Close()
	if err != nil {
		return fail(err)
	}
	// Nothing but stdin, stdout and stderr reaches the runtime: not our
	// result pipe or the hold descriptor, and not descriptors the worker
	// itself inherited without close-on-exec.
	closeInherited()
	pid1 := os.Getpid() == 1
	if !pid1 {
		if err := prctl(prSetChildSubreaper, 1); err != nil {
			return fail(err)
		}
	}
	// No setuid or file-capability binary can give the tree more
	// privileges than the worker started it with.
	if err := prctl(prSetNoNewPrivs, 1); err != nil {
		return fail(err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)

	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fail(err)
	}
	applied, err := apply(pol, pid1)
	if err != nil {
		devnull.Close()
		return fail(err)
	}
	proc, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{devnull, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	devnull.Close()
	if err != nil {
		return fail(err)
	}
	if err := limitChild(pol, proc.Pid); err != nil {
		_ = proc.Kill()
		_, _ = proc.Wait()
		return fail(err)
	}
	done := make(chan *os.ProcessState, 1)
	go func() {
		st, _ := proc.Wait()
		done <- st
	}()

	var timer <-chan time.Time
	stopping := false
	var st *os.ProcessState
wait:
	for {
		select {
		case st = <-done:
			break wait
		case s := <-sigs:
			if s == syscall.SIGTERM && !stopping {
				// The worker asks for a stop: the runtime's group gets
				// SIGTERM and the grace period to end.
				stopping = true
				_ = syscall.Kill(-proc.Pid, syscall.SIGTERM)
				timer = time.After(time.Duration(grace))
				continue
			}
			// SIGHUP is the parent-death signal: the worker is gone, so
			// is everything it started. (Reaping waits until the runtime
			// itself has been waited for.)
			signalTree(pid1, proc.Pid)
		case <-timer:
			signalTree(pid1, proc.Pid)
		}
	}
	r := Result{ExitCode: st.ExitCode(), Applied: strings.Join(applied, ",")}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		r.Signal = int(ws.Signal())
	}
	r.Killed = killTree(pid1, proc.Pid)
	return report(r)
}

func prctl(option, arg uintptr) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, option, arg, 0, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// closeInherited marks every descriptor above stderr close-on-exec.
func closeInherited() {
	if _, _, e := syscall.RawSyscall(sysCloseRange, 3, ^uintptr(0), closeRangeCloexec); e == 0 {
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
	tasks, _ := os.ReadDir("/proc/self/task")
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}
