package launcher_test

import (
	"reflect"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
)

// The spawn request carries every attribute the sandbox's modes use, and
// nothing else gets through.
func TestSpawnRoundTrip(t *testing.T) {
	for _, attr := range []*syscall.SysProcAttr{
		{
			Setsid: true, Pdeathsig: syscall.SIGKILL,
			Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 1000, HostID: 65534, Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 1000, HostID: 65534, Size: 1}},
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 1000, Gid: 1000},
			AmbientCaps:                []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_SETPCAP},
		},
		{Setsid: true, Pdeathsig: syscall.SIGHUP},
		{Cloneflags: syscall.CLONE_NEWUSER, Credential: &syscall.Credential{Uid: 4294967295, Gid: 0, NoSetGroups: true}},
	} {
		s, err := launcher.SpawnOf(attr)
		if err != nil {
			t.Fatalf("%+v: %v", attr, err)
		}
		got, err := launcher.ParseSpawn(s.Format())
		if err != nil {
			t.Fatalf("%s: %v", s.Format(), err)
		}
		if !reflect.DeepEqual(got.Attr(), attr) {
			t.Errorf("round trip of %+v gave %+v (%s)", attr, got.Attr(), s.Format())
		}
	}
}

func TestSpawnRefuses(t *testing.T) {
	for name, attr := range map[string]*syscall.SysProcAttr{
		"chroot":              {Chroot: "/tmp"},
		"ptrace":              {Ptrace: true},
		"unshare":             {Unshareflags: syscall.CLONE_NEWNS},
		"supplementary group": {Credential: &syscall.Credential{Uid: 1, Gid: 1, Groups: []uint32{0}}},
	} {
		if _, err := launcher.SpawnOf(attr); err == nil {
			t.Errorf("%s: SpawnOf took %+v", name, attr)
		}
	}
	for _, msg := range []string{
		"", "spawn", "start 1 0 9 1 0 0 0 0", "spawn 1 0 9 1 0 0 0 0 extra", "spawn 1 2 9 1 0 0 0 0",
		"spawn 1 0 9 1 1 0 0 0 0 0", "spawn 1 0 99 1 0 0 0 0", "spawn 1 0 9 1 0 0 0 1 64", "spawn x 0 9 1 0 0 0 0",
		"spawn 1 0 9 1 0 0 1 1 1 0", "spawn 1 0 9 1 999999 0 0 0",
	} {
		if s, err := launcher.ParseSpawn([]byte(msg)); err == nil {
			t.Errorf("ParseSpawn(%q) = %+v, want an error", msg, s)
		}
	}
	if _, err := launcher.ParseSpawn([]byte("spawn 1 0 9 1 0 0 0 0")); err != nil {
		t.Errorf("the smallest well-formed request: %v", err)
	}
}

func TestSpawnAnswers(t *testing.T) {
	for msg, want := range map[string]launcher.SpawnAnswer{
		"ok 42":         {Kind: "ok", Pid: 42},
		"err no memory": {Kind: "err", Err: "no memory"},
		"exit 42 9":     {Kind: "exit", Pid: 42, Status: 9},
		"exit 42 256":   {Kind: "exit", Pid: 42, Status: 256},
	} {
		got, err := launcher.ParseSpawnAnswer([]byte(msg))
		if err != nil || got != want {
			t.Errorf("ParseSpawnAnswer(%q) = %+v, %v; want %+v", msg, got, err, want)
		}
	}
	for _, msg := range []string{"", "ok", "ok x", "exit 42", "exit 42 x", "done 1"} {
		if a, err := launcher.ParseSpawnAnswer([]byte(msg)); err == nil {
			t.Errorf("ParseSpawnAnswer(%q) = %+v, want an error", msg, a)
		}
	}
}
