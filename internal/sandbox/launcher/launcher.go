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
//   - argv: Name, Protocol, the kill grace in nanoseconds, the runtime's
//     path, then the runtime's argv;
//   - the environment and working directory are the runtime's;
//   - fd 3: the result pipe; fd 4: a descriptor kept open until the tree
//     is gone (the workspace lock), or closed; fd 5: the Policy, or closed;
//   - on exit the launcher writes one result line to fd 3: exit code,
//     signal number, processes killed, layers applied, start error,
//     separated by NUL.
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
// other instead of misreading the arguments.
const (
	Name      = "agora-sandbox"
	ProbeName = "agora-sandbox-probe"
	Protocol  = "agora-sandbox/1"
)

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
