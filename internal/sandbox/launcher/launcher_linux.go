//go:build linux

package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Inherited descriptors.
const (
	fdResult  = 3
	fdControl = 4
)

const (
	prSetChildSubreaper = 36
	prSetNoNewPrivs     = 38
	closeRangeCloexec   = 1 << 2
	maxStart            = 4 << 20 // bytes of a Start message
	// maxSentFDs is how many descriptors a Start message may carry (the
	// kernel's SCM_MAX_FD).
	maxSentFDs = 253
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
	case SpawnerName:
		if len(os.Args) > 1 && os.Args[1] == Protocol {
			os.Exit(spawnerMain())
		}
		os.Exit(3)
	}
}

func main() int {
	// The launcher's own set-up runs on this one thread (init already
	// runs locked to the main thread; this says so). The runtime is forked
	// from another, locked thread (startRuntime).
	runtime.LockOSThread()
	out := os.NewFile(fdResult, "result")
	var fds []int // received: stdout, stderr, the hold descriptor, binds
	ctrl := fdControl
	// ack sends the worker its receipt, once: one byte, Receipt, with
	// ReceiptProxy and ReceiptWorkspace set when it carries the proxy
	// listener and the workspace's own filesystem (in that order).
	ack := func(ln, ws int) error {
		if ctrl < 0 {
			return nil
		}
		defer func() { syscall.Close(ctrl); ctrl = -1 }()
		b := byte(Receipt)
		var fds []int
		if ln >= 0 {
			b |= ReceiptProxy
			fds = append(fds, ln)
		}
		if ws >= 0 {
			b |= ReceiptWorkspace
			fds = append(fds, ws)
		}
		var oob []byte
		if len(fds) > 0 {
			oob = syscall.UnixRights(fds...)
		}
		if err := syscall.Sendmsg(ctrl, []byte{b}, oob, nil, 0); err != nil {
			return fmt.Errorf("launcher: receipt: %w", err)
		}
		return nil
	}
	report := func(r Result) int {
		// The worker goes on as soon as it reads the report: what we
		// hold of the run (the workspace lock first) is let go before.
		for _, fd := range fds {
			if fd >= 0 {
				syscall.Close(fd)
			}
		}
		_, _ = out.WriteString(r.Format())
		return 0
	}
	fail := func(err error) int {
		_ = ack(-1, -1)
		return report(Result{ExitCode: -1, StartErr: err.Error()})
	}
	if len(os.Args) != 2 || os.Args[1] != Protocol {
		return fail(errors.New("launcher: this launcher does not speak " + Protocol + ": use the agora-sandbox of the worker's own build"))
	}
	// Signals are caught from the first moment: a SIGTERM that arrives
	// while the runtime starts still gives it its grace period.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)

	msg, fds, err := receive(ctrl)
	if err != nil {
		return fail(err)
	}
	if msg == nil {
		return 0 // a spare the worker no longer needs
	}
	st, err := ParseStart(msg)
	if err != nil {
		return fail(err)
	}
	if len(fds) < 2 {
		return fail(errors.New("launcher: the start message carries no stdout and stderr"))
	}
	// fds[2], when sent, is the hold descriptor: it stays open (and
	// close-on-exec) until the report, written once the tree is gone.

	// The run's network namespace: loopback, and the proxy's listener,
	// which goes back to the worker with the receipt.
	var applied []string
	if st.Policy.Loopback {
		if err := loopbackUp(); err != nil {
			return fail(err)
		}
		applied = append(applied, "netns")
	}
	ln := -1
	if st.Policy.ProxyPort != 0 {
		if ln, err = listenProxy(st.Policy.ProxyPort); err != nil {
			return fail(err)
		}
		applied = append(applied, "proxy")
	}
	// The run's root is built before the receipt, which carries the
	// workspace's own filesystem when the launcher made it.
	wsFD := -1
	if st.Policy.Root {
		if os.Getpid() != 1 {
			return fail(errors.New("launcher: a root of its own needs the launcher's own PID and mount namespaces"))
		}
		if wsFD, err = buildRoot(st.Policy, fds); err != nil {
			return fail(fmt.Errorf("launcher: %w", err))
		}
		applied = append(applied, "root", "proc")
		if wsFD >= 0 {
			applied = append(applied, "workspace-fs")
		}
	}
	err = ack(ln, wsFD)
	for _, fd := range []int{ln, wsFD} {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
	if err != nil {
		return fail(err)
	}

	// Nothing but stdin, stdout and stderr reaches the runtime: not our
	// result pipe, the received descriptors or the hold descriptor, and
	// not descriptors the worker itself inherited without close-on-exec.
	closeInherited()
	pid1 := os.Getpid() == 1
	if !pid1 {
		if err := prctl(prSetChildSubreaper, 1); err != nil {
			return fail(fmt.Errorf("subreaper: %w", err))
		}
	}
	// No setuid or file-capability binary can give the tree more
	// privileges than the worker started it with.
	if err := prctl(prSetNoNewPrivs, 1); err != nil {
		return fail(fmt.Errorf("no_new_privs: %w", err))
	}
	devnull, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("open %s: %w", os.DevNull, err))
	}
	more, err := apply(st.Policy, pid1)
	if err != nil {
		return fail(err)
	}
	applied = append(applied, more...)
	pid, caps, err := startRuntime(st, devnull, fds)
	syscall.Close(devnull)
	syscall.Close(fds[0])
	syscall.Close(fds[1])
	fds[0], fds[1] = -1, -1
	if err != nil {
		return fail(err)
	}
	if caps {
		applied = append(applied, "no-capabilities")
	}
	if err := limitChild(st.Policy, pid); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_, _ = syscall.Wait4(pid, nil, 0, nil)
		return fail(err)
	}
	done := make(chan syscall.WaitStatus, 1)
	go func() {
		var ws syscall.WaitStatus
		for {
			if _, err := syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
				break
			}
		}
		done <- ws
	}()

	var timer <-chan time.Time
	stopping := false
	var ws syscall.WaitStatus
wait:
	for {
		select {
		case ws = <-done:
			break wait
		case s := <-sigs:
			if s == syscall.SIGTERM && !stopping {
				// The worker asks for a stop: the runtime's group gets
				// SIGTERM and the grace period to end.
				stopping = true
				_ = syscall.Kill(-pid, syscall.SIGTERM)
				timer = time.After(time.Duration(st.Grace))
				continue
			}
			// SIGHUP is the parent-death signal: the worker is gone, so
			// is everything it started. (Reaping waits until the runtime
			// itself has been waited for.)
			signalTree(pid1, pid)
		case <-timer:
			signalTree(pid1, pid)
		}
	}
	r := Result{ExitCode: -1, Applied: strings.Join(applied, ",")}
	if ws.Exited() {
		r.ExitCode = ws.ExitStatus()
	}
	if ws.Signaled() {
		r.Signal = int(ws.Signal())
	}
	r.Killed = killTree(pid1, pid)
	return report(r)
}

// startRuntime forks and execs the runtime from a thread of its own,
// locked and never unlocked (so it ends with its goroutine): that thread
// takes a Landlock domain nested in the launcher's (the runtime then
// cannot signal or trace its launcher) and, when the launcher is in a user
// namespace of its own, gives up every capability before the fork. It
// reports whether capabilities were dropped.
func startRuntime(st Start, devnull int, fds []int) (int, bool, error) {
	type started struct {
		pid  int
		caps bool
		err  error
	}
	ch := make(chan started, 1)
	go func() {
		runtime.LockOSThread()
		var r started
		// no_new_privs is per thread: this one forks the runtime.
		if err := prctl(prSetNoNewPrivs, 1); err != nil {
			r.err = fmt.Errorf("no_new_privs: %w", err)
			ch <- r
			return
		}
		if st.Policy.Landlock {
			if abi, err := llsys.LandlockGetABIVersion(); err == nil && abi >= 1 {
				if r.err = restrictThread(abi, st.Policy); r.err != nil {
					ch <- r
					return
				}
			}
		}
		if inUserNS() {
			if r.caps, r.err = dropThreadCaps(); r.err != nil {
				ch <- r
				return
			}
			if !r.caps && st.Policy.Root {
				r.err = errors.New("launcher: cannot drop the bounding set of the run's capabilities")
				ch <- r
				return
			}
		}
		// syscall.ForkExec rather than os.StartProcess: the latter
		// probes for pidfd support with a fork of its own the first
		// time, and every launcher is a first time.
		r.pid, r.err = syscall.ForkExec(st.Path, st.Args, &syscall.ProcAttr{
			Dir: st.Dir, Env: st.Env,
			Files: []uintptr{uintptr(devnull), uintptr(fds[0]), uintptr(fds[1])},
			Sys:   &syscall.SysProcAttr{Setpgid: true},
		})
		if r.err != nil {
			r.err = fmt.Errorf("fork/exec %s in %s: %w", st.Path, st.Dir, r.err)
		}
		ch <- r
	}()
	r := <-ch
	return r.pid, r.caps, r.err
}

// inUserNS reports whether the launcher runs in a user namespace of its
// own (its uid map is not the initial namespace's identity map).
func inUserNS() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return !(len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295")
}

// receive reads the Start message and the descriptors sent with it from
// the control socket until the worker closes its side. A socket closed
// with nothing sent gives a nil message. The receipt is sent by the
// caller once the run's network is set up.
func receive(fd int) ([]byte, []int, error) {
	var msg []byte
	var fds []int
	buf := make([]byte, 64<<10)
	oob := make([]byte, syscall.CmsgSpace(4*maxSentFDs))
	for {
		n, oobn, _, _, err := syscall.Recvmsg(fd, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("launcher: read start message: %w", err)
		}
		if oobn > 0 {
			cms, err := syscall.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return nil, nil, fmt.Errorf("launcher: start message: %w", err)
			}
			for i := range cms {
				if r, err := syscall.ParseUnixRights(&cms[i]); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		if n == 0 {
			return msg, fds, nil
		}
		msg = append(msg, buf[:n]...)
		if len(msg) > maxStart {
			return nil, nil, errors.New("launcher: start message too large")
		}
	}
}

func prctl(option, arg uintptr) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, option, arg, 0, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// closeInherited marks every descriptor above stderr close-on-exec.
func closeInherited() {
	if _, _, e := syscall.RawSyscall(unix.SYS_CLOSE_RANGE, 3, ^uintptr(0), closeRangeCloexec); e == 0 {
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
