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
	// runs locked to the main thread; this says so). Every step below is
	// called from it, in this order. The runtime is forked from another,
	// locked thread (startRuntime).
	runtime.LockOSThread()
	l := &launch{out: os.NewFile(fdResult, "result"), ctrl: fdControl}
	if len(os.Args) != 2 || os.Args[1] != Protocol {
		return l.fail(errors.New("launcher: this launcher does not speak " + Protocol + ": use the agora-sandbox of the worker's own build"))
	}
	// Signals are caught from the first moment: a SIGTERM that arrives
	// while the runtime starts still gives it its grace period.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)

	st, ok, err := l.receiveStart()
	if err != nil {
		return l.fail(err)
	}
	if !ok {
		return 0 // a spare the worker no longer needs
	}
	if err := l.prepare(st.Policy); err != nil {
		return l.fail(err)
	}
	devnull, pid1, err := l.lockDown(st.Policy)
	if err != nil {
		return l.fail(err)
	}
	pid, err := l.start(st, devnull)
	if err != nil {
		return l.fail(err)
	}
	ws := waitRuntime(pid, pid1, time.Duration(st.Grace), sigs)
	return l.report(l.finish(ws, pid1, pid))
}

// launch is what the launcher holds of the run it starts, from the Start
// message to the report.
type launch struct {
	out     *os.File // the result pipe
	ctrl    int      // the control socket; -1 once the receipt is sent
	fds     []int    // received: stdout, stderr, the hold descriptor, binds
	applied []string // the layers set up, for the report
}

// ack sends the worker its receipt, once: one byte, Receipt, with
// ReceiptProxy and ReceiptWorkspace set when it carries the proxy
// listener and the workspace's own filesystem (in that order).
func (l *launch) ack(ln, ws int) error {
	if l.ctrl < 0 {
		return nil
	}
	defer func() { syscall.Close(l.ctrl); l.ctrl = -1 }()
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
	if err := syscall.Sendmsg(l.ctrl, []byte{b}, oob, nil, 0); err != nil {
		return fmt.Errorf("launcher: receipt: %w", err)
	}
	return nil
}

// report writes the result for the worker; main returns what it returns.
func (l *launch) report(r Result) int {
	// The worker goes on as soon as it reads the report: what we
	// hold of the run (the workspace lock first) is let go before.
	for _, fd := range l.fds {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
	_, _ = l.out.WriteString(r.Format())
	return 0
}

// fail sends the receipt if it is still owed and reports err as the
// run's start error.
func (l *launch) fail(err error) int {
	_ = l.ack(-1, -1)
	return l.report(Result{ExitCode: -1, StartErr: err.Error()})
}

// receiveStart reads the Start message and its descriptors. ok is false
// for a spare the worker closed without sending one.
func (l *launch) receiveStart() (st Start, ok bool, err error) {
	msg, fds, err := receive(l.ctrl)
	l.fds = fds
	if err != nil {
		return st, false, err
	}
	if msg == nil {
		return st, false, nil
	}
	if st, err = ParseStart(msg); err != nil {
		return st, false, err
	}
	if len(l.fds) < 2 {
		return st, false, errors.New("launcher: the start message carries no stdout and stderr")
	}
	// fds[2], when sent, is the hold descriptor: it stays open (and
	// close-on-exec) until the report, written once the tree is gone.
	return st, true, nil
}

// prepare sets up the run's network and root, then sends the receipt
// with what the worker gets of them.
func (l *launch) prepare(p Policy) error {
	ln, err := l.network(p)
	if err != nil {
		return err
	}
	// The run's root is built before the receipt, which carries the
	// workspace's own filesystem when the launcher made it.
	wsFD, err := l.root(p)
	if err != nil {
		return err
	}
	err = l.ack(ln, wsFD)
	for _, fd := range []int{ln, wsFD} {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
	return err
}

// network sets up the run's network namespace: loopback, and the proxy's
// listener (-1 when there is none), which goes back to the worker with
// the receipt.
func (l *launch) network(p Policy) (ln int, err error) {
	if p.Loopback {
		if err := loopbackUp(); err != nil {
			return -1, err
		}
		l.applied = append(l.applied, "netns")
	}
	ln = -1
	if p.ProxyPort != 0 {
		if ln, err = listenProxy(p.ProxyPort); err != nil {
			return ln, err
		}
		l.applied = append(l.applied, "proxy")
	}
	return ln, nil
}

// root builds the run's root when the policy asks for one, and returns
// the workspace's own filesystem (-1 when there is none).
func (l *launch) root(p Policy) (wsFD int, err error) {
	wsFD = -1
	if !p.Root {
		return wsFD, nil
	}
	if os.Getpid() != 1 {
		return wsFD, errors.New("launcher: a root of its own needs the launcher's own PID and mount namespaces")
	}
	if wsFD, err = buildRoot(p, l.fds); err != nil {
		return wsFD, fmt.Errorf("launcher: %w", err)
	}
	l.applied = append(l.applied, "root", "proc")
	if wsFD >= 0 {
		l.applied = append(l.applied, "workspace-fs")
	}
	return wsFD, nil
}

// lockDown confines the launcher before it starts the runtime, and opens
// the runtime's stdin. pid1 tells whether the launcher is its PID
// namespace's init.
func (l *launch) lockDown(p Policy) (devnull int, pid1 bool, err error) {
	// Nothing but stdin, stdout and stderr reaches the runtime: not our
	// result pipe, the received descriptors or the hold descriptor, and
	// not descriptors the worker itself inherited without close-on-exec.
	closeInherited()
	pid1 = os.Getpid() == 1
	if !pid1 {
		if err := prctl(prSetChildSubreaper, 1); err != nil {
			return -1, pid1, fmt.Errorf("subreaper: %w", err)
		}
	}
	// No setuid or file-capability binary can give the tree more
	// privileges than the worker started it with.
	if err := prctl(prSetNoNewPrivs, 1); err != nil {
		return -1, pid1, fmt.Errorf("no_new_privs: %w", err)
	}
	devnull, err = syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, pid1, fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	more, err := apply(p, pid1)
	if err != nil {
		return devnull, pid1, err
	}
	l.applied = append(l.applied, more...)
	return devnull, pid1, nil
}

// start starts the runtime with devnull as its stdin and the received
// stdout and stderr, which the launcher then lets go, and puts it under
// the policy's limits.
func (l *launch) start(st Start, devnull int) (int, error) {
	pid, caps, err := startRuntime(st, devnull, l.fds)
	syscall.Close(devnull)
	syscall.Close(l.fds[0])
	syscall.Close(l.fds[1])
	l.fds[0], l.fds[1] = -1, -1
	if err != nil {
		return pid, err
	}
	if caps {
		l.applied = append(l.applied, "no-capabilities")
	}
	if err := limitChild(st.Policy, pid); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_, _ = syscall.Wait4(pid, nil, 0, nil)
		return pid, err
	}
	return pid, nil
}

// waitRuntime waits for the runtime to end, passing on the worker's stop
// (SIGTERM, then the grace period) and the worker's death (SIGHUP).
func waitRuntime(pid int, pid1 bool, grace time.Duration, sigs <-chan os.Signal) syscall.WaitStatus {
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
	for {
		select {
		case ws := <-done:
			return ws
		case s := <-sigs:
			if s == syscall.SIGTERM && !stopping {
				// The worker asks for a stop: the runtime's group gets
				// SIGTERM and the grace period to end.
				stopping = true
				_ = syscall.Kill(-pid, syscall.SIGTERM)
				timer = time.After(grace)
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
}

// finish kills what is left of the run's tree and gives the result of
// the run that ended with ws.
func (l *launch) finish(ws syscall.WaitStatus, pid1 bool, pid int) Result {
	r := Result{ExitCode: -1, Applied: strings.Join(l.applied, ",")}
	if ws.Exited() {
		r.ExitCode = ws.ExitStatus()
	}
	if ws.Signaled() {
		r.Signal = int(ws.Signal())
	}
	r.Killed = killTree(pid1, pid)
	return r
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
