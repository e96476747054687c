//go:build linux

package launcher

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

// fdSpawner is the spawner's socket to the worker.
const fdSpawner = 3

const sysPidfdOpen = 434 // the same number on every Linux architecture

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
// ends, "exit <pid> <wait status>" follows. A launcher is forked from this
// small process rather than from the worker: a fork that makes a user
// namespace cannot share the parent's memory (vfork), so it copies the
// parent's page tables and leaves every page of the parent copy-on-write —
// a cost that grows with the worker's heap, here with this process's few
// megabytes.
func spawnerMain() int {
	syscall.CloseOnExec(fdSpawner) // never a launcher's
	devnull, err := syscall.Open("/dev/null", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 1
	}
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4*2))
	for {
		n, oobn, _, _, err := syscall.Recvmsg(fdSpawner, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			// The worker is done with us (or gone). Launchers still
			// running die with us (their parent-death signal): the worker
			// closes its end only once none is left.
			return 0
		}
		var fds []int
		if oobn > 0 {
			if cms, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for i := range cms {
					if r, err := syscall.ParseUnixRights(&cms[i]); err == nil {
						fds = append(fds, r...)
					}
				}
			}
		}
		spawn(buf[:n], fds, devnull)
	}
}

// spawn starts one launcher and answers the worker.
func spawn(msg []byte, fds []int, devnull int) {
	defer func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}()
	answer := func(s string, rights []byte) {
		for syscall.Sendmsg(fdSpawner, []byte(s), rights, nil, 0) == syscall.EINTR {
		}
	}
	sp, err := ParseSpawn(msg)
	if err == nil && len(fds) != 2 {
		err = fmt.Errorf("launcher: spawn: %d descriptors, want the result pipe and the control socket", len(fds))
	}
	if err != nil {
		answer("err "+err.Error(), nil)
		return
	}
	pid, err := syscall.ForkExec("/proc/self/exe", []string{Name, Protocol}, &syscall.ProcAttr{
		Dir: "/", Env: []string{"GOMAXPROCS=1"},
		Files: []uintptr{uintptr(devnull), uintptr(devnull), uintptr(devnull), uintptr(fds[0]), uintptr(fds[1])},
		Sys:   sp.Attr(),
	})
	if err != nil {
		answer("err "+err.Error(), nil)
		return
	}
	// The launcher is not reaped before the wait below: its pid names it
	// until then, so the pidfd opened now is its.
	pidfd, _, e := syscall.RawSyscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if e != 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
		answer("err pidfd_open: "+e.Error(), nil)
		return
	}
	answer("ok "+strconv.Itoa(pid), syscall.UnixRights(int(pidfd)))
	syscall.Close(int(pidfd))
	go func() {
		var ws syscall.WaitStatus
		for {
			if _, err := syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
				break
			}
		}
		answer("exit "+strconv.Itoa(pid)+" "+strconv.FormatUint(uint64(ws), 10), nil)
	}()
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
