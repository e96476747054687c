package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
)

// Launcher starts runtimes through the launcher. It is safe for concurrent
// use.
type Launcher struct {
	exe  string
	bin  *os.File // the launcher binary, open for the Launcher's life
	via  string   // its path through /proc/self/fd
	mode Mode
	attr func() *syscall.SysProcAttr
	host Host
	// offAttr starts the launcher of a run with no sandbox (mode off):
	// the worker's own user, network and filesystem, a PID namespace
	// where the host allows one. Nil: as attr.
	offAttr func() *syscall.SysProcAttr
	offMode Mode

	// spares are launchers started ahead of their run (docs/sandbox.md,
	// "Started ahead"): a run takes one and pays only for sending it the
	// Start message, not for a process start, its namespaces and the Go
	// runtime's initialisation. The run that took one starts its
	// replacement when it ends.
	spares   chan *spare
	mu       sync.Mutex
	starting int // spares being started
	closed   bool
	// spawner forks the launchers that start in a user namespace of
	// their own, started on the first such launcher (spawnerFor).
	spawner      *spawner
	spawnerTried bool
	spawnerErr   error // why it could not start
}

// spareLaunchers is how many launchers a Launcher keeps started ahead.
const spareLaunchers = 2

// spare is a started launcher waiting for its Start message.
type spare struct {
	pid    int
	signal func(syscall.Signal) error
	ctrl   int      // our end of the control socket; -1 once closed
	res    *os.File // the result pipe's read end
	done   chan struct{}
	err    error // the launcher's exit (as exec.Cmd.Wait words it), once done is closed
}

// newSpare is the spare of launcher pid, signalled through signal.
func newSpare(pid int, signal func(syscall.Signal) error) *spare {
	return &spare{pid: pid, signal: signal, ctrl: -1, done: make(chan struct{})}
}

// end records the launcher's exit.
func (sp *spare) end(err error) {
	sp.err = err
	close(sp.done)
}

// closeCtrl closes our end of the control socket, once.
func (sp *spare) closeCtrl() {
	if sp.ctrl >= 0 {
		syscall.Close(sp.ctrl)
		sp.ctrl = -1
	}
}

// discard kills the launcher (if it still lives), waits for it and
// releases what the worker holds of it.
func (sp *spare) discard() {
	sp.closeCtrl()
	_ = sp.signal(syscall.SIGKILL)
	<-sp.done
	sp.res.Close()
}

// New finds the launcher binary (see Executable) and probes the strongest
// containment the host allows: user, PID, mount, network, IPC and UTS
// namespaces of the run's own (ModeNamespaces), else a PID namespace, else a
// subreaper.
func New(o Options) (*Launcher, error) {
	var errs []error
	for _, m := range []Mode{ModeNamespaces, ModePIDNamespace} {
		l, err := NewMode(o, m)
		if err == nil {
			return l, nil
		}
		if errors.Is(err, ErrLauncher) {
			return nil, err
		}
		errs = append(errs, err)
	}
	l, err := NewMode(o, ModeSubreaper)
	if err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	return l, nil
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
func NewMode(o Options, mode Mode) (*Launcher, error) {
	l, err := openLauncher(o.Bin)
	if err != nil {
		return nil, err
	}
	switch mode {
	case ModeNamespaces:
		return l.useNamespaces(o)
	case ModePIDNamespace:
		return l.usePIDNamespace()
	case ModeSubreaper:
		return l.useSubreaper()
	default:
		return nil, fmt.Errorf("sandbox: mode %q is not available on Linux", mode)
	}
}

// openLauncher checks that bin (Executable() when empty) is a launcher of
// this build and opens it for the Launcher that starts it.
func openLauncher(bin string) (*Launcher, error) {
	if bin == "" {
		bin = Executable()
	}
	// The binary must be a launcher of this build: it answers the probe.
	if err := (&exec.Cmd{Path: bin, Args: []string{launcher.ProbeName, launcher.Protocol}}).Run(); err != nil {
		return nil, fmt.Errorf("%w: %s is not a launcher speaking %s (%v)", ErrLauncher, bin, launcher.Protocol, err)
	}
	// Launchers are started through a descriptor of the binary, so that a
	// run's unprivileged user need not reach its folder (a binary under
	// /root, a test's temporary folder): exec through /proc/self/fd checks
	// only the file's own execute permission.
	binFile, err := os.Open(bin)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrLauncher, err)
	}
	via := "/proc/self/fd/" + strconv.Itoa(int(binFile.Fd()))
	return &Launcher{exe: bin, bin: binFile, via: via, spares: make(chan *spare, spareLaunchers)}, nil
}

// probe starts the launcher with attr to ask what the host gives it.
func (l *Launcher) probe(attr *syscall.SysProcAttr) (Host, error) {
	out, err := (&exec.Cmd{Path: l.via, Args: []string{launcher.ProbeName, launcher.Protocol}, SysProcAttr: attr}).Output()
	if err != nil {
		return Host{}, err
	}
	var h Host
	var userns, netns, sc bool
	_, err = fmt.Sscanf(string(out), "landlock=%d proc=%t userns=%t netns=%t seccomp=%t", &h.LandlockABI, &h.PrivateProc, &userns, &netns, &sc)
	h.UserNamespace, h.NetworkNamespace, h.Seccomp = userns, netns, sc
	return h, err
}

// pidNamespaceAttrs are the ways to start a launcher in a PID namespace
// of its own, in the order they are tried: as it is, then in a user
// namespace mapping the worker's own uid and gid.
func pidNamespaceAttrs() []func() *syscall.SysProcAttr {
	uid, gid := os.Getuid(), os.Getgid()
	return []func() *syscall.SysProcAttr{
		func() *syscall.SysProcAttr {
			return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
		},
		func() *syscall.SysProcAttr {
			return &syscall.SysProcAttr{
				Setsid: true, Pdeathsig: syscall.SIGKILL,
				Cloneflags:  syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUSER,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
			}
		},
	}
}

// namespacesAttr is how a launcher starts in namespaces of its own, and
// the host uid its run's user maps to: RunUID inside its namespace, mapped
// to an unprivileged host uid — the worker's own when it is not root, the
// configured one (never 0) when it is.
func namespacesAttr(o Options) (attr func() *syscall.SysProcAttr, hostUID int) {
	hostUID, hostGID, rootless := os.Geteuid(), os.Getegid(), os.Geteuid() != 0
	if !rootless && o.RunUID != OwnUID {
		hostUID, hostGID = o.runUID(), o.runUID()
	}
	return func() *syscall.SysProcAttr {
		return &syscall.SysProcAttr{
			Setsid: true, Pdeathsig: syscall.SIGKILL,
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS |
				syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: RunUID, HostID: hostUID, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: RunUID, HostID: hostGID, Size: 1}},
			// A root worker clears the supplementary groups (root's and
			// any other); an unprivileged one may not, and keeps its own.
			GidMappingsEnableSetgroups: !rootless,
			Credential:                 &syscall.Credential{Uid: RunUID, Gid: RunUID},
			// What the launcher needs to build the run's root and
			// network inside its own namespaces; the runtime gets none.
			AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_SETPCAP},
		}
	}, hostUID
}

// useNamespaces sets l to ModeNamespaces, and its runs with no sandbox to
// a PID namespace where the host allows one, else a subreaper.
func (l *Launcher) useNamespaces(o Options) (*Launcher, error) {
	nsAttr, hostUID := namespacesAttr(o)
	h, err := l.probe(nsAttr())
	if err != nil {
		return nil, fmt.Errorf("sandbox: no user and network namespaces on this host (%w)", err)
	}
	if !h.UserNamespace || !h.NetworkNamespace || !h.PrivateProc {
		return nil, fmt.Errorf("sandbox: namespaces incomplete on this host (user %t, network %t, /proc %t)", h.UserNamespace, h.NetworkNamespace, h.PrivateProc)
	}
	h.RunUID = hostUID
	l.mode, l.attr, l.host = ModeNamespaces, nsAttr, h
	for _, attr := range pidNamespaceAttrs() {
		if _, err := l.probe(attr()); err == nil {
			l.offAttr, l.offMode = attr, ModePIDNamespace
			break
		}
	}
	if l.offAttr == nil {
		l.offAttr, l.offMode = func() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGHUP} }, ModeSubreaper
	}
	return l, nil
}

// usePIDNamespace sets l to the first way of starting in a PID namespace
// the host allows.
func (l *Launcher) usePIDNamespace() (*Launcher, error) {
	var errs []error
	for _, attr := range pidNamespaceAttrs() {
		h, err := l.probe(attr())
		if err == nil {
			l.mode, l.attr, l.host = ModePIDNamespace, attr, h
			return l, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("sandbox: no PID namespace on this host (%w)", errors.Join(errs...))
}

// useSubreaper sets l to ModeSubreaper.
func (l *Launcher) useSubreaper() (*Launcher, error) {
	l.mode = ModeSubreaper
	l.attr = func() *syscall.SysProcAttr {
		// SIGHUP, not SIGKILL: the launcher must live to kill its tree.
		return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGHUP}
	}
	h, err := l.probe(l.attr())
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

// UnconfinedMode reports how it contains the tree of a run with no
// sandbox (Spec.Unconfined): the worker's own user and network, in a PID
// namespace where the host allows one.
func (l *Launcher) UnconfinedMode() Mode {
	if l.offAttr != nil {
		return l.offMode
	}
	return l.mode
}

// Close stops the spare launchers, and the spawner once the runs it
// started launchers for have ended. Runs may still be started afterwards;
// they start their launcher when they need it, from the worker.
func (l *Launcher) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		s := l.spawner
		l.mu.Unlock()
		if s != nil {
			s.close()
		}
	}()
	for {
		select {
		case sp := <-l.spares:
			sp.discard()
		default:
			return
		}
	}
}

// start starts a launcher process that waits for its Start message.
func (l *Launcher) start() (*spare, error) { return l.startWith(l.attr()) }

// startWith starts a launcher with attr.
func (l *Launcher) startWith(attr *syscall.SysProcAttr) (*spare, error) {
	if attr.Cloneflags&syscall.CLONE_NEWUSER != 0 {
		if s := l.spawnerFor(); s != nil {
			sp, err := withChannels(func(resW, theirs *os.File) (*spare, error) { return s.start(attr, resW, theirs) })
			if !errors.Is(err, errSpawnerGone) {
				return sp, err
			}
			// Closed, dead or misbehaving: the worker forks the
			// launcher itself, with descriptors of its own.
		}
	}
	return withChannels(func(resW, theirs *os.File) (*spare, error) {
		cmd := &exec.Cmd{
			Path: l.via, Args: []string{launcher.Name, launcher.Protocol},
			// Nothing of the worker's environment: the run's comes with
			// its Start message. One P is all a launcher uses; its Go
			// runtime then starts fewer threads (about 0.2 ms and a fifth
			// of the system time of each start, measured here).
			Env: []string{"GOMAXPROCS=1"}, Dir: "/",
			ExtraFiles:  []*os.File{resW, theirs},
			SysProcAttr: attr,
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		sp := newSpare(cmd.Process.Pid, func(sig syscall.Signal) error { return cmd.Process.Signal(sig) })
		go func() { sp.end(cmd.Wait()) }()
		return sp, nil
	})
}

// withChannels makes a launcher's result pipe and control socket and
// starts it with start, which gets the pipe's write end and the launcher's
// end of the socket; those are closed here once start returns. The spare
// keeps the read end and the worker's end of the socket.
func withChannels(start func(resW, theirs *os.File) (*spare, error)) (*spare, error) {
	resR, resW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		resR.Close()
		resW.Close()
		return nil, err
	}
	theirs := os.NewFile(uintptr(fds[1]), "control")
	sp, err := start(resW, theirs)
	resW.Close()
	theirs.Close()
	if err != nil {
		resR.Close()
		syscall.Close(fds[0])
		return nil, err
	}
	sp.ctrl, sp.res = fds[0], resR
	return sp, nil
}

// spawnerFor returns the spawner, started on first use (docs/sandbox.md,
// "The spawner"); nil after Close, or where it could not start (the
// worker forks its launchers itself then).
func (l *Launcher) spawnerFor() *spawner {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	if l.spawner == nil && !l.spawnerTried {
		l.spawnerTried = true
		l.spawner, l.spawnerErr = startSpawner(l.via)
	}
	return l.spawner
}

// Spawner starts the spawner now where this Launcher's launchers need one
// (else the first such launcher starts it) and reports why it could not
// start: its launchers are then forked from the worker, which costs the
// worker more CPU per run the larger its memory (docs/sandbox.md, "The
// spawner"). Nil when it runs, or when no launcher needs one.
func (l *Launcher) Spawner() error {
	if l.attr().Cloneflags&syscall.CLONE_NEWUSER == 0 {
		return nil
	}
	l.spawnerFor()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.spawnerErr
}

// take returns a started launcher: a spare when one is ready (unless
// fresh), else one started now. The spares are refilled when the run ends
// (Run), not now, so that starting them does not compete with the run.
func (l *Launcher) take(fresh bool) (*spare, error) {
	for !fresh {
		select {
		case sp := <-l.spares:
			select {
			case <-sp.done: // died while it waited (killed from outside)
				sp.discard()
				continue
			default:
				return sp, nil
			}
		default:
			return l.start()
		}
	}
	return l.start()
}

// refill starts spares until there are spareLaunchers of them, counting
// those being started.
func (l *Launcher) refill() {
	for {
		l.mu.Lock()
		if l.closed || len(l.spares)+l.starting >= cap(l.spares) {
			l.mu.Unlock()
			return
		}
		l.starting++
		l.mu.Unlock()
		sp, err := l.start()
		l.mu.Lock()
		l.starting--
		if err != nil {
			l.mu.Unlock()
			return // the run that needs one starts its own and reports why
		}
		if l.closed {
			l.mu.Unlock()
			sp.discard()
			return
		}
		select {
		case l.spares <- sp:
			l.mu.Unlock()
		default:
			l.mu.Unlock()
			sp.discard()
			return
		}
	}
}

// send writes the Start message with the descriptors it carries, closes
// our side for writing and waits for the launcher's one-byte receipt; a
// launcher that died while it waited gives none. The receipt may carry the
// run's proxy listener and the workspace's own filesystem, returned as
// descriptors, or -1.
func (sp *spare) send(msg []byte, files ...*os.File) (ln, ws int, err error) {
	ln, ws = -1, -1
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	n, err := syscall.SendmsgN(sp.ctrl, msg, syscall.UnixRights(fds...), nil, 0)
	for err == nil && n < len(msg) {
		var m int
		m, err = syscall.Write(sp.ctrl, msg[n:])
		n += m
	}
	for _, f := range files {
		runtime.KeepAlive(f)
	}
	if err == nil {
		err = syscall.Shutdown(sp.ctrl, syscall.SHUT_WR)
	}
	if err == nil {
		// Bounded: a launcher reads its message before anything else.
		_ = syscall.SetsockoptTimeval(sp.ctrl, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{Sec: 10})
		var b [1]byte
		oob := make([]byte, syscall.CmsgSpace(4*2))
		var oobn int
		for {
			n, oobn, _, _, err = syscall.Recvmsg(sp.ctrl, b[:], oob, syscall.MSG_CMSG_CLOEXEC)
			if err != syscall.EINTR {
				break
			}
		}
		if err == nil && n != 1 {
			err = errors.New("the launcher ended before it read its run")
		}
		var got []int
		if err == nil && oobn > 0 {
			if cms, perr := syscall.ParseSocketControlMessage(oob[:oobn]); perr == nil && len(cms) > 0 {
				got, _ = syscall.ParseUnixRights(&cms[0])
			}
		}
		next := func() int {
			if len(got) == 0 {
				return -1
			}
			fd := got[0]
			got = got[1:]
			return fd
		}
		if b[0]&launcher.ReceiptProxy != 0 {
			ln = next()
		}
		if b[0]&launcher.ReceiptWorkspace != 0 {
			ws = next()
		}
		for _, fd := range got {
			syscall.Close(fd) // not asked for
		}
	}
	sp.closeCtrl()
	return ln, ws, err
}

// offAttrOrDefault is the attribute of a launcher for a run with no
// sandbox.
func (l *Launcher) offAttrOrDefault() *syscall.SysProcAttr {
	if l.offAttr != nil {
		return l.offAttr()
	}
	return l.attr()
}

// joinCgroups writes pid into each cgroup.procs file.
func joinCgroups(procs []string, pid int) error {
	for _, p := range procs {
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("join cgroup %s: %w", p, err)
		}
	}
	return nil
}

// openBind is a bind's host path, opened.
type openBind struct {
	f          *os.File
	target     string
	write, dir bool
}

// under reports whether path lies inside one of dirs.
func under(path string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(path, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// openSource opens a bind's source. A root worker clones the path's mount
// tree (open_tree), which the launcher moves into the run's root from its
// own mount namespace — a plain descriptor of another mount namespace
// cannot be bound there — without its user ever resolving the path. A
// worker that is not root opens the path; the launcher, its own user,
// binds it by path.
func openSource(path string) (int, error) {
	if os.Geteuid() == 0 {
		fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err == nil || !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.ENOSYS) {
			return fd, err
		}
	}
	return unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
}

// openBinds opens each bind's host path (O_PATH, following links: /lib may
// be a link to /usr/lib), leaving out paths that do not exist. Targets are
// mounted in order, a parent before what lies under it.
func openBinds(bs []Bind) ([]openBind, error) {
	sorted := slices.Clone(bs)
	slices.SortStableFunc(sorted, func(a, b Bind) int { return strings.Compare(a.Target, b.Target) })
	var out []openBind
	seen := map[string]bool{}
	var shown []string // directories bound at their own host path
	for _, b := range sorted {
		if seen[b.Target] || b.Host == b.Target && under(b.Target, shown) {
			continue // the run sees it already, through a folder above
		}
		fd, err := openSource(b.Host)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			for _, o := range out {
				o.f.Close()
			}
			return nil, fmt.Errorf("sandbox: %s: %w", b.Host, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			continue
		}
		seen[b.Target] = true
		if b.Host == b.Target && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			shown = append(shown, b.Target)
		}
		out = append(out, openBind{f: os.NewFile(uintptr(fd), b.Host), target: b.Target, write: b.Write, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR})
	}
	if len(out) > 240 {
		for _, o := range out {
			o.f.Close()
		}
		return nil, fmt.Errorf("sandbox: %d paths to show the run; at most 240 (merge read_paths into fewer folders)", len(out))
	}
	return out, nil
}

// Run starts s through the launcher and blocks until the runtime and every
// process it started are gone. When ctx ends, the runtime's process group
// gets SIGTERM, and everything is killed after s.KillGrace.
func (l *Launcher) Run(ctx context.Context, s Spec) Result {
	outR, outW, errR, errW, err := outputPipes()
	if err != nil {
		return launcherErr("%v", err)
	}
	binds, err := openBinds(s.Binds)
	if err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return Result{ExitCode: -1, Err: err}
	}
	defer closeBinds(binds)
	msg, files := startMessage(s, binds, outW, errW)
	sp, lnFD, wsFD, err := l.launch(s, msg, files)
	outW.Close()
	errW.Close()
	handWorkspace(s, wsFD)
	if stop := serveProxy(ctx, s, lnFD); stop != nil {
		defer stop()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		go l.refill()
		return launcherErr("start: %v", err)
	}
	defer sp.res.Close()
	copied := copyOutput(s, outR, errR)
	line := awaitReport(ctx, sp, s.KillGrace)
	go l.refill()
	// (The launcher is reaped either way; without a report its exit is
	// the only news of it.)
	var werr error
	if !bytes.HasSuffix(line, []byte("\n")) {
		<-sp.done
		werr = sp.err
	}
	drainOutput(copied, outR, errR)
	return resultOf(line, werr)
}

// launcherErr is the Result of a run the launcher failed to start.
func launcherErr(format string, err error) Result {
	return Result{ExitCode: -1, Err: fmt.Errorf("%w: "+format, ErrLauncher, err)}
}

// outputPipes opens the pipes of the runtime's stdout and stderr.
func outputPipes() (outR, outW, errR, errW *os.File, err error) {
	outR, outW, err = os.Pipe()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	errR, errW, err = os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, nil, nil, err
	}
	return outR, outW, errR, errW, nil
}

// closeBinds closes the binds' descriptors once the run is over.
func closeBinds(binds []openBind) {
	for _, b := range binds {
		b.f.Close()
	}
}

// startMessage is the Start message of the run and the files sent with
// it: stdout, stderr, the hold descriptor (or a placeholder) and the
// binds, which the message's policy names by their index.
func startMessage(s Spec, binds []openBind, outW, errW *os.File) ([]byte, []*os.File) {
	files := []*os.File{outW, errW}
	if s.Hold != nil {
		files = append(files, s.Hold)
	} else {
		files = append(files, nil) // the binds' indexes start at 3
	}
	pol := s.Policy
	pol.Binds = nil
	for _, b := range binds {
		pol.Binds = append(pol.Binds, launcher.Bind{FD: len(files), Target: b.target, Write: b.write, Dir: b.dir})
		files = append(files, b.f)
	}
	if files[2] == nil && len(binds) == 0 {
		files = files[:2]
	} else if files[2] == nil {
		files[2] = binds[0].f // a placeholder the launcher holds like a lock
	}
	msg := launcher.Start{Grace: int64(s.KillGrace), Path: s.Path, Args: s.Args, Env: s.Env, Dir: s.Dir, Policy: pol}.Format()
	return msg, files
}

// launch gives the run a launcher in its cgroups and sends it msg and
// files; it returns the launcher and the proxy listener and workspace
// descriptors of its receipt (-1 when absent). A spare can have been
// killed while it waited: the next one is tried, and in the end one
// started for this run alone.
func (l *Launcher) launch(s Spec, msg []byte, files []*os.File) (sp *spare, lnFD, wsFD int, err error) {
	lnFD, wsFD = -1, -1
	for try := 0; ; try++ {
		if s.Unconfined {
			sp, err = l.startWith(l.offAttrOrDefault())
			try = cap(l.spares) + 1
		} else {
			sp, err = l.take(try > cap(l.spares))
		}
		if err == nil {
			// The run's cgroups take the launcher before it starts
			// anything: the launcher's user may not write them.
			err = joinCgroups(s.Cgroups, sp.pid)
		}
		if err == nil {
			if lnFD, wsFD, err = sp.send(msg, files...); err != nil {
				sp.discard()
			}
		} else if sp != nil {
			sp.discard()
		}
		if err == nil || try > cap(l.spares) {
			return sp, lnFD, wsFD, err
		}
	}
}

// handWorkspace gives the workspace's own filesystem, when the launcher
// sent one, to s.Workspace, or closes it.
func handWorkspace(s Spec, wsFD int) {
	if wsFD < 0 {
		return
	}
	f := os.NewFile(uintptr(wsFD), "workspace")
	if s.Workspace != nil {
		s.Workspace(f)
	} else {
		f.Close()
	}
}

// serveProxy serves the run's proxy listener, when the launcher sent one,
// with s.Proxy until the returned stop is called (nil when nothing is
// served).
func serveProxy(ctx context.Context, s Spec, lnFD int) (stop func()) {
	if lnFD < 0 {
		return nil
	}
	// FileListener dups the descriptor: the file is closed through
	// itself, never by its number, or its finalizer would close the
	// number again, whatever holds it by then.
	lf := os.NewFile(uintptr(lnFD), "proxy")
	ln, lerr := net.FileListener(lf)
	lf.Close()
	if lerr != nil {
		return nil
	}
	if s.Proxy == nil {
		ln.Close()
		return nil
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	proxyDone := make(chan struct{})
	go func() { defer close(proxyDone); s.Proxy(pctx, ln) }()
	return func() { cancel(); ln.Close(); <-proxyDone }
}

// copyOutput copies the runtime's output to s.Stdout and s.Stderr (nil
// discards); the channel receives once per pipe at its end.
func copyOutput(s Spec, outR, errR *os.File) <-chan struct{} {
	copied := make(chan struct{}, 2)
	copyOut := func(w io.Writer, r *os.File) {
		if w == nil {
			w = io.Discard
		}
		_, _ = io.Copy(w, r)
		copied <- struct{}{}
	}
	go copyOut(s.Stdout, outR)
	go copyOut(s.Stderr, errR)
	return copied
}

// awaitReport reads the launcher's report line; when ctx ends first, the
// launcher is asked to stop its tree (SIGTERM), then killed once grace
// and two seconds more have passed.
func awaitReport(ctx context.Context, sp *spare, grace time.Duration) []byte {
	// The launcher writes its report once the tree is gone and the
	// workspace lock released; its own exit (a Go process ending: most of
	// a millisecond) is waited for in the background. Without a report —
	// the launcher was killed — the pipe ends with the process.
	report := make(chan []byte, 1)
	go func() {
		b, _ := bufio.NewReader(io.LimitReader(sp.res, 64<<10)).ReadBytes('\n')
		report <- b
	}()
	select {
	case line := <-report:
		return line
	case <-ctx.Done():
	}
	_ = sp.signal(syscall.SIGTERM)
	t := time.NewTimer(grace + 2*time.Second)
	select {
	case line := <-report:
		t.Stop()
		return line
	case <-t.C:
		// The launcher did not end its tree in time. In a PID
		// namespace its death takes the tree with it.
		_ = sp.signal(syscall.SIGKILL)
		return <-report
	}
}

// drainOutput waits for both output copies to end, then closes the pipes.
// The output pipes close when the tree is gone; the bound only matters
// for a launcher killed while something else held them.
func drainOutput(copied <-chan struct{}, outR, errR *os.File) {
	bound := time.NewTimer(time.Second)
	for range 2 {
		select {
		case <-copied:
		case <-bound.C:
			outR.Close()
			errR.Close()
			<-copied
		}
	}
	bound.Stop()
	outR.Close()
	errR.Close()
}

// resultOf turns the launcher's report line into the run's Result; werr
// is the launcher's exit when it wrote no report.
func resultOf(line []byte, werr error) Result {
	r, err := launcher.Parse(string(line))
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
