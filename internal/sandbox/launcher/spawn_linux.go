//go:build linux

package launcher

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// fdSpawner is the spawner's socket to the worker.
const fdSpawner = 3

// Spawn is what a worker asks its spawner for: a launcher started with
// these process attributes (docs/sandbox.md, "The spawner"). It holds the
// part of a syscall.SysProcAttr the sandbox's modes use.
type Spawn struct {
	Cloneflags  uintptr
	UIDMap      []syscall.SysProcIDMap
	GIDMap      []syscall.SysProcIDMap
	Setgroups   bool // GidMappingsEnableSetgroups
	Credential  *syscall.Credential
	AmbientCaps []uintptr
	Pdeathsig   syscall.Signal
	Setsid      bool
}

// SpawnOf returns the Spawn that starts a launcher with attr, or an error
// when attr uses anything a Spawn does not carry.
func SpawnOf(attr *syscall.SysProcAttr) (Spawn, error) {
	rest := *attr
	s := Spawn{
		Cloneflags: rest.Cloneflags, UIDMap: rest.UidMappings, GIDMap: rest.GidMappings, Setgroups: rest.GidMappingsEnableSetgroups,
		Credential: rest.Credential, AmbientCaps: rest.AmbientCaps, Pdeathsig: rest.Pdeathsig, Setsid: rest.Setsid,
	}
	if s.Credential != nil && len(s.Credential.Groups) > 0 {
		return Spawn{}, errors.New("launcher: spawn: supplementary groups are not carried")
	}
	rest.Cloneflags, rest.UidMappings, rest.GidMappings, rest.GidMappingsEnableSetgroups = 0, nil, nil, false
	rest.Credential, rest.AmbientCaps, rest.Pdeathsig, rest.Setsid = nil, nil, 0, false
	if !isZero(rest) {
		return Spawn{}, errors.New("launcher: spawn: attributes beyond those the sandbox uses")
	}
	return s, nil
}

func isZero(a syscall.SysProcAttr) bool {
	return a.Chroot == "" && !a.Ptrace && !a.Setpgid && !a.Setctty && !a.Noctty && a.Ctty == 0 && !a.Foreground && a.Pgid == 0 &&
		a.Unshareflags == 0 && !a.UseCgroupFD && a.PidFD == nil
}

// Attr is the process attribute s stands for.
func (s Spawn) Attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags: s.Cloneflags, UidMappings: s.UIDMap, GidMappings: s.GIDMap, GidMappingsEnableSetgroups: s.Setgroups,
		Credential: s.Credential, AmbientCaps: s.AmbientCaps, Pdeathsig: s.Pdeathsig, Setsid: s.Setsid,
	}
}

// Format encodes s as space-separated decimal fields.
func (s Spawn) Format() []byte {
	f := []string{"spawn", u(uint64(s.Cloneflags)), b(s.Setgroups), strconv.Itoa(int(s.Pdeathsig)), b(s.Setsid)}
	maps := func(m []syscall.SysProcIDMap) {
		f = append(f, strconv.Itoa(len(m)))
		for _, e := range m {
			f = append(f, strconv.Itoa(e.ContainerID), strconv.Itoa(e.HostID), strconv.Itoa(e.Size))
		}
	}
	maps(s.UIDMap)
	maps(s.GIDMap)
	if s.Credential == nil {
		f = append(f, "0")
	} else {
		f = append(f, "1", u(uint64(s.Credential.Uid)), u(uint64(s.Credential.Gid)), b(s.Credential.NoSetGroups))
	}
	f = append(f, strconv.Itoa(len(s.AmbientCaps)))
	for _, c := range s.AmbientCaps {
		f = append(f, u(uint64(c)))
	}
	return []byte(strings.Join(f, " "))
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

func b(v bool) string {
	if v {
		return "1"
	}
	return "0"
}

// ParseSpawn decodes what Format wrote.
func ParseSpawn(msg []byte) (Spawn, error) {
	f := strings.Fields(string(msg))
	bad := fmt.Errorf("launcher: malformed spawn message %q", msg)
	if len(f) == 0 || f[0] != "spawn" {
		return Spawn{}, bad
	}
	f = f[1:]
	var failed bool
	next := func(max uint64) uint64 {
		if len(f) == 0 {
			failed = true
			return 0
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		f = f[1:]
		if err != nil || v > max {
			failed = true
		}
		return v
	}
	const maxID = 1<<32 - 1
	var s Spawn
	s.Cloneflags = uintptr(next(1<<63 - 1))
	s.Setgroups = next(1) == 1
	s.Pdeathsig = syscall.Signal(next(64))
	s.Setsid = next(1) == 1
	maps := func() []syscall.SysProcIDMap {
		n := next(340) // the kernel's limit of lines in an id map
		var m []syscall.SysProcIDMap
		for range n {
			if failed {
				break
			}
			m = append(m, syscall.SysProcIDMap{ContainerID: int(next(maxID)), HostID: int(next(maxID)), Size: int(next(maxID))})
		}
		return m
	}
	s.UIDMap, s.GIDMap = maps(), maps()
	if next(1) == 1 {
		s.Credential = &syscall.Credential{Uid: uint32(next(maxID)), Gid: uint32(next(maxID)), NoSetGroups: next(1) == 1}
	}
	n := next(64)
	for range n {
		if failed {
			break
		}
		s.AmbientCaps = append(s.AmbientCaps, uintptr(next(63)))
	}
	if failed || len(f) != 0 {
		return Spawn{}, bad
	}
	return s, nil
}

// spawnerMain serves the worker's spawn requests on fdSpawner until the
// worker closes its end (docs/sandbox.md, "The spawner"). Each request
// carries the launcher's result pipe and control socket; the answer is
// "ok <pid>" with a pidfd of the launcher, or "err <why>"; when a launcher
// ends, "exit <pid> <wait status>" follows, always before a later "ok" can
// name the same pid. A launcher is forked from this small process rather
// than from the worker: a fork that makes a user namespace cannot share
// the parent's memory (vfork), so it copies the parent's page tables and
// leaves every page of the parent copy-on-write — a cost that grows with
// the worker's heap, here with this process's few megabytes. An answer
// that cannot be sent, or a request that is not one, ends the spawner: the
// worker then sees its socket close and forks launchers itself.
func spawnerMain() int {
	syscall.CloseOnExec(fdSpawner) // never a launcher's
	devnull, err := syscall.Open("/dev/null", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 1
	}
	sp := &spawner{devnull: devnull}
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4*2))
	for {
		n, oobn, flags, _, err := syscall.Recvmsg(fdSpawner, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			// The worker is done with us (or gone). Launchers still
			// running die with us (their parent-death signal): the worker
			// closes its end only once none is left.
			return 0
		}
		fds, rerr := Rights(oob[:oobn])
		if rerr != nil || flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0 {
			return 4
		}
		if !sp.spawn(buf[:n], fds) {
			return 4
		}
	}
}

// Rights returns the descriptors passed (SCM_RIGHTS) in the control
// messages oob of one received message.
func Rights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	cms, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range cms {
		r, err := syscall.ParseUnixRights(&cms[i])
		if err != nil {
			return fds, err
		}
		fds = append(fds, r...)
	}
	return fds, nil
}

// spawner is the spawner process's state.
type spawner struct {
	devnull int
	// mu is held from a fork to its answer, and from a launcher's reaping
	// to its exit message, so that a pid freed by a reap is reported
	// ended before a new launcher can be reported under it.
	mu sync.Mutex
}

// answer sends one message to the worker. A message lost would leave the
// worker waiting for it, so the spawner ends instead: the worker sees its
// socket close, takes every launcher it started for ended, and forks the
// next ones itself.
func (s *spawner) answer(msg string, rights []byte) {
	for {
		err := syscall.Sendmsg(fdSpawner, []byte(msg), rights, nil, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			os.Exit(4)
		}
		return
	}
}

// spawn starts one launcher and answers the worker. It reports false when
// the request was not one.
func (s *spawner) spawn(msg []byte, fds []int) bool {
	defer func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}()
	sp, err := ParseSpawn(msg)
	if err != nil {
		return false
	}
	if len(fds) != 2 {
		s.answer(fmt.Sprintf("err launcher: spawn: %d descriptors, want the result pipe and the control socket", len(fds)), nil)
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, err := syscall.ForkExec("/proc/self/exe", []string{Name, Protocol}, &syscall.ProcAttr{
		Dir: "/", Env: []string{"GOMAXPROCS=1"},
		Files: []uintptr{uintptr(s.devnull), uintptr(s.devnull), uintptr(s.devnull), uintptr(fds[0]), uintptr(fds[1])},
		Sys:   sp.Attr(),
	})
	if err != nil {
		s.answer("err "+err.Error(), nil)
		return true
	}
	// The launcher is not reaped before its exit is reported (below): its
	// pid names it until then, so the pidfd opened now is its.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
		s.answer("err pidfd_open: "+err.Error(), nil)
		return true
	}
	s.answer("ok "+strconv.Itoa(pid), syscall.UnixRights(pidfd))
	syscall.Close(pidfd)
	go s.reap(pid)
	return true
}

// reap waits for launcher pid to end without reaping it, then reaps it and
// reports its exit under mu.
func (s *spawner) reap(pid int) {
	var info unix.Siginfo // not read: waitid only waits here
	for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var ws syscall.WaitStatus
	for {
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
			break
		}
	}
	s.answer("exit "+strconv.Itoa(pid)+" "+strconv.FormatUint(uint64(ws), 10), nil)
}

// SpawnAnswer is one message of the spawner: Kind "ok" (Pid, and the
// pidfd sent with it), "err" (Err) or "exit" (Pid, Status).
type SpawnAnswer struct {
	Kind   string
	Pid    int
	Status syscall.WaitStatus
	Err    string
}

// ParseSpawnAnswer decodes a message of the spawner.
func ParseSpawnAnswer(msg []byte) (SpawnAnswer, error) {
	kind, rest, _ := strings.Cut(string(msg), " ")
	a := SpawnAnswer{Kind: kind}
	var err error
	switch kind {
	case "err":
		a.Err = rest
	case "ok":
		a.Pid, err = strconv.Atoi(rest)
	case "exit":
		p, st, _ := strings.Cut(rest, " ")
		var s uint64
		if a.Pid, err = strconv.Atoi(p); err == nil {
			s, err = strconv.ParseUint(st, 10, 32)
			a.Status = syscall.WaitStatus(s)
		}
	default:
		err = errors.New("unknown kind")
	}
	if err != nil {
		return SpawnAnswer{}, fmt.Errorf("launcher: malformed spawner message %q: %w", msg, err)
	}
	return a, nil
}
