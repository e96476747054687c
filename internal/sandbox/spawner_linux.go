package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
)

// errSpawnerGone is returned for a request the spawner can no longer
// serve: the Launcher was closed, or the spawner died or misbehaved. The
// caller forks the launcher itself, with descriptors of its own.
var errSpawnerGone = errors.New("sandbox: the spawner is gone")

// spawnerAnswerWait bounds the wait for the spawner's answer to one
// request: a fork and a pidfd, well under a second on any host; a spawner
// that takes longer is killed and the worker forks its launchers itself.
const spawnerAnswerWait = 10 * time.Second

// spawner is the worker's end of its spawner, the small process launchers
// that start in a user namespace of their own are forked from
// (docs/sandbox.md, "The spawner"). Forking such a launcher from the
// worker itself copies the worker's page tables (a fork that makes a user
// namespace cannot share the parent's memory) and leaves every page of
// the worker copy-on-write, a cost that grows with the worker's heap.
type spawner struct {
	cmd     *exec.Cmd
	req     sync.Mutex   // one request at a time, answered in order; close takes it too
	fdMu    sync.RWMutex // held for reading while fd is used; the reader closes it
	fd      int
	answers chan spawnAnswer

	mu      sync.Mutex
	live    map[int]spawned // started, not yet ended
	closing bool
	gone    bool
}

type spawnAnswer struct {
	sp  *spare
	err error
}

// startSpawner starts the spawner from the launcher binary at via. Its
// start shares the worker's memory until its exec (no user namespace of
// its own): the one cheap fork the worker pays for. It fails where the
// host does not let the worker open and signal pidfds (Linux 5.3, and a
// seccomp profile that allows both), through which launchers from the
// spawner are signalled.
func startSpawner(via string) (*spawner, error) {
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: no pidfd on this host: %w", err)
	}
	err = unix.PidfdSendSignal(pidfd, 0, nil, 0)
	syscall.Close(pidfd)
	if err != nil {
		return nil, fmt.Errorf("sandbox: pidfds cannot be signalled on this host: %w", err)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	theirs := os.NewFile(uintptr(fds[1]), "spawner")
	cmd := &exec.Cmd{
		Path: via, Args: []string{launcher.SpawnerName, launcher.Protocol},
		Env: []string{"GOMAXPROCS=1"}, Dir: "/",
		ExtraFiles: []*os.File{theirs},
		// It ends when the worker does: its socket closes then, and the
		// parent-death signal covers a worker killed outright.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL},
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		syscall.Close(fds[0])
		return nil, err
	}
	s := &spawner{cmd: cmd, fd: fds[0], answers: make(chan spawnAnswer, 1), live: map[int]spawned{}}
	go s.read()
	return s, nil
}

// start asks the spawner for a launcher with attr, passing it the result
// pipe's write end and the launcher's end of the control socket, and
// returns its spare with the pid, signal and exit filled in. On
// errSpawnerGone the spawner may have received the descriptors: the caller
// must not give them to another launcher.
func (s *spawner) start(attr *syscall.SysProcAttr, files ...*os.File) (*spare, error) {
	msg, err := launcher.SpawnOf(attr)
	if err != nil {
		return nil, err
	}
	s.req.Lock()
	defer s.req.Unlock()
	s.mu.Lock()
	gone := s.gone || s.closing
	s.mu.Unlock()
	if gone {
		return nil, errSpawnerGone
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	s.fdMu.RLock()
	err = syscall.Sendmsg(s.fd, msg.Format(), syscall.UnixRights(fds...), nil, 0)
	s.fdMu.RUnlock()
	runtime.KeepAlive(files)
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", errSpawnerGone, err) // it died: not yet read
	}
	t := time.NewTimer(spawnerAnswerWait)
	defer t.Stop()
	select {
	case a, ok := <-s.answers:
		if !ok {
			return nil, errSpawnerGone
		}
		return a.sp, a.err
	case <-t.C:
		s.kill()
		return nil, fmt.Errorf("%w (no answer within %s)", errSpawnerGone, spawnerAnswerWait)
	}
}

// kill ends a spawner that misbehaved; no request is sent to it again,
// and the reader ends what it started once its socket closes.
func (s *spawner) kill() {
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	_ = s.cmd.Process.Kill()
}

// read takes the spawner's messages until it ends: answers go to the
// request waiting for them, a launcher's exit to its spare. A message that
// is not one of the protocol's ends the spawner.
func (s *spawner) read() {
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4*2))
	for {
		n, oobn, flags, _, err := syscall.Recvmsg(s.fd, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			break
		}
		rights, rerr := launcher.Rights(oob[:oobn])
		a, err := launcher.ParseSpawnAnswer(buf[:n])
		want := 0
		if a.Kind == "ok" {
			want = 1
		}
		if err != nil || rerr != nil || len(rights) != want || flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0 {
			for _, fd := range rights {
				syscall.Close(fd)
			}
			s.kill()
			break
		}
		switch a.Kind {
		case "ok":
			sp := newSpawned(a.Pid, rights[0])
			s.mu.Lock()
			_, dup := s.live[a.Pid]
			if !dup {
				s.live[a.Pid] = sp
			}
			s.mu.Unlock()
			if dup { // the spawner reports an exit before a pid is reused
				sp.end(errSpawnerGone)
				s.kill()
				break
			}
			s.answers <- spawnAnswer{sp: sp.spare}
			continue
		case "err":
			s.answers <- spawnAnswer{err: fmt.Errorf("sandbox: spawner: %s", a.Err)}
			continue
		case "exit":
			s.mu.Lock()
			sp, ok := s.live[a.Pid]
			delete(s.live, a.Pid)
			s.mu.Unlock()
			if ok {
				sp.end(waitErr(a.Status))
			}
			s.shutdownIfDone()
			continue
		}
		break
	}
	// The spawner ended (or was shut down, or killed): the launchers it
	// started die with it (their parent-death signal).
	s.mu.Lock()
	s.gone = true
	live := s.live
	s.live = nil
	s.mu.Unlock()
	for _, sp := range live {
		sp.end(errSpawnerGone)
	}
	close(s.answers)
	s.fdMu.Lock()
	syscall.Close(s.fd)
	s.fd = -1
	s.fdMu.Unlock()
	_ = s.cmd.Wait()
}

// close lets the spawner go once the launchers it started have ended;
// later launchers are forked by the worker itself. It waits for a request
// in flight, so that none is cut off.
func (s *spawner) close() {
	s.req.Lock()
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.req.Unlock()
	s.shutdownIfDone()
}

func (s *spawner) shutdownIfDone() {
	s.mu.Lock()
	done := s.closing && !s.gone && len(s.live) == 0
	s.mu.Unlock()
	if done {
		s.fdMu.RLock()
		if s.fd >= 0 {
			_ = syscall.Shutdown(s.fd, syscall.SHUT_RDWR)
		}
		s.fdMu.RUnlock()
	}
}

// spawned is a launcher the spawner started, until it ends.
type spawned struct {
	*spare
	end func(error) // its exit: closes the pidfd, then ends the spare
}

// newSpawned is the spare of a launcher the spawner started: signalled
// through its pidfd (never another process that reuses its pid), ended
// when the spawner reports its exit.
func newSpawned(pid, pidfd int) spawned {
	var mu sync.Mutex
	sp := newSpare(pid, func(sig syscall.Signal) error {
		mu.Lock()
		defer mu.Unlock()
		if pidfd < 0 {
			return os.ErrProcessDone
		}
		return unix.PidfdSendSignal(pidfd, sig, nil, 0)
	})
	return spawned{spare: sp, end: func(err error) {
		mu.Lock()
		if pidfd >= 0 {
			syscall.Close(pidfd)
			pidfd = -1
		}
		mu.Unlock()
		sp.end(err)
	}}
}

// waitErr is the error exec.Cmd.Wait would give for status.
func waitErr(st syscall.WaitStatus) error {
	switch {
	case st.Exited() && st.ExitStatus() == 0:
		return nil
	case st.Signaled():
		return fmt.Errorf("signal: %v", st.Signal())
	default:
		return fmt.Errorf("exit status %d", st.ExitStatus())
	}
}
