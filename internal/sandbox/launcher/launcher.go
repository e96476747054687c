// Package launcher is the launcher process of internal/sandbox: the part
// that runs inside the re-executed worker binary, between the worker and
// the sub-agent's runtime (docs/sandbox.md).
//
// Its init function takes over a process started with argv[0] = Name and
// never returns. The package imports only what the Go runtime initialises
// first (os, os/signal, syscall), so a launcher starts before the rest of
// a large binary's packages initialise: its cost stays close to a bare Go
// program's start.
//
// Protocol (internal/sandbox writes and reads it):
//   - argv: Name, Protocol; GOMAXPROCS=1 as the whole environment; stdin,
//     stdout and stderr on /dev/null. The worker may start a launcher
//     before it has a run for it (a started spare), so nothing of a run is
//     in its arguments or environment;
//   - fd 4: one end of a Unix stream socket on which the worker sends one
//     Start message, then shuts its side for writing and waits for one
//     byte back (the launcher's receipt, carrying as SCM_RIGHTS the proxy
//     listener of the run's network when the policy asks for one). The
//     message carries, as SCM_RIGHTS, the runtime's stdout and stderr, a
//     descriptor kept open until the tree is gone (the workspace lock) and
//     the sources of the policy's binds, which name them by index.
//     A launcher whose socket closes with no message exits quietly;
//   - fd 3: the result pipe: once the runtime's whole tree is gone, the
//     launcher closes the descriptors it was sent (releasing the lock) and
//     writes one result line: exit code, signal number, processes killed,
//     layers applied, start error, separated by NUL. The worker takes the
//     line as the end of the run; the launcher's own exit follows.
//
// A worker whose launchers start in a user namespace of their own starts
// them through a spawner (argv SpawnerName, Protocol; fd 3 a Unix
// sequenced-packet socket): see spawnerMain.
package launcher

import (
	"errors"
	"strconv"
	"strings"
)

// Name is argv[0] of a process that acts as the launcher; ProbeName is
// argv[0] of one started only to test what the host allows and whether it
// speaks Protocol (it exits 0 when it does). Protocol is argv[1] of both:
// a worker and a separate launcher binary from another build refuse each
// other instead of misreading the arguments. SpawnerName is argv[0] of the
// process a worker forks its launchers from (docs/sandbox.md, "The
// spawner").
const (
	Name        = "agora-sandbox"
	ProbeName   = "agora-sandbox-probe"
	SpawnerName = "agora-sandbox-spawner"
	Protocol    = "agora-sandbox/4"
)

// The receipt's byte: Receipt, with ReceiptProxy when it carries the run's
// proxy listener and ReceiptWorkspace when it carries the workspace's own
// filesystem (the descriptors in that order).
const (
	Receipt          = 1
	ReceiptProxy     = 2
	ReceiptWorkspace = 4
)

// Start is the run a started launcher is given: the runtime, its
// environment and working directory, how long it has between SIGTERM and
// SIGKILL, and the Policy.
type Start struct {
	Grace  int64 // nanoseconds
	Path   string
	Args   []string
	Env    []string
	Dir    string
	Policy Policy
}

// Format encodes s: NUL-separated fields (no argument, environment entry
// or path can hold a NUL), the policy last.
func (s Start) Format() []byte {
	f := []string{strconv.FormatInt(s.Grace, 10), s.Path, s.Dir, strconv.Itoa(len(s.Args))}
	f = append(f, s.Args...)
	f = append(f, strconv.Itoa(len(s.Env)))
	f = append(f, s.Env...)
	f = append(f, s.Policy.Format())
	return []byte(strings.Join(f, "\x00"))
}

// ParseStart decodes what Format wrote.
func ParseStart(b []byte) (Start, error) {
	f := strings.Split(string(b), "\x00")
	bad := errors.New("launcher: malformed start message")
	if len(f) < 6 {
		return Start{}, bad
	}
	var s Start
	var err error
	if s.Grace, err = strconv.ParseInt(f[0], 10, 64); err != nil {
		return Start{}, bad
	}
	s.Path, s.Dir = f[1], f[2]
	f = f[3:]
	list := func() ([]string, bool) {
		n, err := strconv.Atoi(f[0])
		if err != nil || n < 0 || n > len(f)-2 {
			return nil, false
		}
		l := f[1 : 1+n]
		f = f[1+n:]
		return l, true
	}
	var ok bool
	if s.Args, ok = list(); !ok {
		return Start{}, bad
	}
	if s.Env, ok = list(); !ok || len(f) != 1 {
		return Start{}, bad
	}
	s.Policy, err = ParsePolicy(strings.NewReader(f[0]))
	return s, err
}

// Result is the launcher's report, as internal/sandbox parses it.
type Result struct {
	ExitCode int
	Signal   int // the signal that ended the runtime, 0 if none
	Killed   int // leftover processes killed
	// Applied lists the layers the launcher put in place, comma-separated
	// (e.g. "no_new_privs,cgroup,proc,tmp,rlimits,landlock-v7").
	Applied  string
	StartErr string
}

// Format encodes r as the result line.
func (r Result) Format() string {
	return strings.Join([]string{strconv.Itoa(r.ExitCode), strconv.Itoa(r.Signal), strconv.Itoa(r.Killed), r.Applied, strings.ReplaceAll(r.StartErr, "\x00", " ")}, "\x00") + "\n"
}

// Parse decodes a result line.
func Parse(s string) (Result, error) {
	f := strings.SplitN(strings.TrimSuffix(s, "\n"), "\x00", 5)
	if len(f) != 5 {
		return Result{}, errors.New("launcher: malformed result")
	}
	var r Result
	var err1, err2, err3 error
	r.ExitCode, err1 = strconv.Atoi(f[0])
	r.Signal, err2 = strconv.Atoi(f[1])
	r.Killed, err3 = strconv.Atoi(f[2])
	r.Applied, r.StartErr = f[3], f[4]
	return r, errors.Join(err1, err2, err3)
}
