//go:build linux && amd64

package sandbox_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/agora-dispatch/agora/internal/sandbox"
)

// A test binary started with this variable is a run's runtime that makes
// the calls of deniedCalls and allowedCalls and prints each one's errno.
const syscallsEnv = "AGORA_SANDBOX_TEST_SYSCALLS"

func init() {
	if os.Getenv(syscallsEnv) == "1" {
		trySyscalls()
		os.Exit(0)
	}
}

// syscallTry is one call with its x86_64 number and arguments.
type syscallTry struct {
	name string
	nr   uintptr
	args []uintptr
}

var scratch = make([]byte, 128)

func buf() uintptr { return uintptr(unsafe.Pointer(&scratch[0])) }

// deniedCalls must answer EPERM in a run: the seccomp filter's denied
// list and socket rules (docs/sandbox.md, "seccomp"), beyond what the
// hostile suites try. In the same run without the filter, 13 of them
// reach the kernel (io_uring_setup, an AF_VSOCK socket and a netlink audit
// socket succeed; the rest fail on their arguments) and 6 are refused by
// the missing capabilities alone.
var deniedCalls = []syscallTry{
	{"bpf", 321, []uintptr{5, buf(), 128}},
	{"perf_event_open", 298, []uintptr{buf(), 0, ^uintptr(0), ^uintptr(0), 0}},
	{"userfaultfd", 323, []uintptr{0}},
	{"open_by_handle_at", 304, []uintptr{^uintptr(99), buf(), 0}},
	{"kcmp", 312, []uintptr{1, 1, 0, 0, 0}},
	{"pidfd_getfd", 438, []uintptr{3, 0, 0}},
	{"add_key", 248, []uintptr{0, 0, 0, 0, 0}},
	{"io_uring_setup", 425, []uintptr{8, buf()}},
	{"unshare", 272, []uintptr{syscall.CLONE_NEWUSER}},
	{"setns", 308, []uintptr{0, 0}},
	{"mount_setattr", 442, []uintptr{^uintptr(99), 0, 0, 0, 0}},
	{"swapon", 167, []uintptr{0, 0}},
	{"syslog", 103, []uintptr{3, buf(), 100}},
	{"socket AF_VSOCK", 41, []uintptr{40, syscall.SOCK_STREAM, 0}},
	{"socket AF_ALG", 41, []uintptr{38, syscall.SOCK_SEQPACKET, 0}},
	{"socket AF_BLUETOOTH", 41, []uintptr{31, syscall.SOCK_STREAM, 0}},
	{"socket netlink audit", 41, []uintptr{syscall.AF_NETLINK, syscall.SOCK_RAW, 9}},
	{"socket AF_INET raw", 41, []uintptr{syscall.AF_INET, syscall.SOCK_RAW, 1}},
	{"socketpair AF_INET", 53, []uintptr{syscall.AF_INET, syscall.SOCK_STREAM, 0, buf()}},
}

// allowedCalls must work inside the sandbox.
var allowedCalls = []syscallTry{
	{"socket AF_UNIX", 41, []uintptr{syscall.AF_UNIX, syscall.SOCK_STREAM, 0}},
	{"socket AF_INET TCP", 41, []uintptr{syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_TCP}},
	{"socket netlink route", 41, []uintptr{syscall.AF_NETLINK, syscall.SOCK_RAW, 0}},
}

// trySyscalls makes every call and prints "name<TAB>errno number".
func trySyscalls() {
	for _, c := range append(append([]syscallTry{}, deniedCalls...), allowedCalls...) {
		a := append(append([]uintptr{}, c.args...), make([]uintptr, 6-len(c.args))...)
		_, _, e := syscall.Syscall6(c.nr, a[0], a[1], a[2], a[3], a[4], a[5])
		fmt.Printf("%s\t%d\n", c.name, int(e))
	}
}

// A run with the seccomp layer, started by either launcher binary (the
// table assembled ahead of time is what both load here), gets EPERM for
// every call of deniedCalls and makes the calls of allowedCalls.
func TestSeccompRefusesInARun(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		if l.Mode() != sandbox.ModeNamespaces {
			return // seccomp comes with the namespaces mode
		}
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		exe := filepath.Join(dir, "runtime")
		data, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(exe, data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		sys := []string{"/usr", "/lib", "/lib64"}
		binds := []sandbox.Bind{{Host: dir, Target: dir}}
		for _, d := range sys {
			if _, err := os.Stat(d); err == nil {
				binds = append(binds, sandbox.Bind{Host: d, Target: d})
			}
		}
		var out, errb bytes.Buffer
		res := l.Run(t.Context(), sandbox.Spec{Path: exe, Args: []string{"runtime"}, Env: []string{syscallsEnv + "=1"}, Dir: "/",
			Stdout: &out, Stderr: &errb, KillGrace: time.Second, Binds: binds,
			Policy: sandbox.Policy{Landlock: true, ReadDirs: append(sys, dir), Root: true, Loopback: true, Seccomp: true}})
		if res.Err != nil || res.ExitCode != 0 || !strings.Contains(res.Applied, "seccomp") {
			t.Fatalf("run: %+v\nstderr: %s", res, errb.String())
		}
		got := map[string]syscall.Errno{}
		sc := bufio.NewScanner(&out)
		for sc.Scan() {
			var e int
			name, num, _ := strings.Cut(sc.Text(), "\t")
			if _, err := fmt.Sscan(num, &e); err == nil {
				got[name] = syscall.Errno(e)
			}
		}
		for _, c := range deniedCalls {
			if e, ok := got[c.name]; !ok || e != syscall.EPERM {
				t.Errorf("%s: errno %d (%v), reported %v; want EPERM", c.name, e, e, ok)
			}
		}
		for _, c := range allowedCalls {
			if e, ok := got[c.name]; !ok || e != 0 {
				t.Errorf("%s: errno %d (%v), reported %v; want it to work", c.name, e, e, ok)
			}
		}
	})
}
