// Package sandbox starts a sub-agent's runtime through a launcher: the
// running binary re-executed as a small supervisor that sits between the
// worker and the runtime (docs/sandbox.md).
//
// The launcher owns the runtime's whole process tree. It is a child
// subreaper (or PID 1 of its own PID namespace where the host allows one),
// so a grandchild that daemonises is re-parented to it rather than to the
// host's init; when the runtime exits, when the worker asks it to stop, or
// when the worker dies, the launcher kills every process of the tree and
// reaps it before it exits. The worker therefore never leaves a process
// behind, not even when it is killed with SIGKILL.
//
// Any binary that imports this package can act as the launcher: the init
// function of internal/sandbox/launcher takes over when the process was
// started with argv[0] set to the launcher's name, so the agora binary, the
// worker binary and test binaries all work without a separate executable.
package sandbox

import (
	"errors"
	"io"
	"os"
	"time"

	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
)

// Spec is one runtime to start inside the sandbox.
type Spec struct {
	// Path is the executable, already resolved; Args is its argv
	// (Args[0] included).
	Path string
	Args []string
	// Env is the runtime's complete environment. The launcher itself runs
	// with this environment and nothing else of the worker's.
	Env []string
	// Dir is the working directory (the workspace).
	Dir string
	// Stdout and Stderr receive the runtime's output. Nil discards it.
	Stdout, Stderr io.Writer
	// KillGrace is how long the runtime has between SIGTERM and SIGKILL
	// when the run is stopped.
	KillGrace time.Duration
	// Hold, when set, is an open file the launcher keeps open (and so any
	// lock on it held) until the whole tree is gone. It is not passed on to
	// the runtime.
	Hold *os.File
	// Policy is what the launcher applies before it starts the runtime
	// (Landlock, resource limits, private /proc and /tmp, cgroups).
	Policy Policy
}

// Policy is the launcher's policy (internal/sandbox/launcher).
type Policy = launcher.Policy

// Host is what the launcher can apply on this host, found by probing it
// once.
type Host struct {
	// LandlockABI is the kernel's Landlock ABI version; 0 when Landlock is
	// missing or disabled.
	LandlockABI int `json:"landlock_abi"`
	// PrivateProc tells whether the launcher mounts a /proc of its own
	// (PID and mount namespaces): the runtime sees only its own processes.
	PrivateProc bool `json:"private_proc"`
}

// Result is how a sandboxed runtime ended.
type Result struct {
	// ExitCode is the runtime's exit code, or -1 when a signal ended it or
	// it never started.
	ExitCode int
	// Signal names the signal that ended the runtime, if one did.
	Signal string
	// Err is set when the runtime could not be started (for example the
	// executable is not runnable) or the launcher itself failed
	// (ErrLauncher).
	Err error
	// Killed counts the processes the launcher had to kill after the
	// runtime exited or was stopped (daemonised grandchildren and the like).
	Killed int
	// Applied lists the layers the launcher put in place.
	Applied string
}

// Mode is how the launcher contains the process tree on this host.
type Mode string

const (
	// ModePIDNamespace: the launcher is PID 1 of a new PID namespace. The
	// kernel kills every process in it when the launcher exits, and the
	// runtime cannot name (so cannot signal) any process outside it.
	ModePIDNamespace Mode = "pid-namespace"
	// ModeSubreaper: the launcher is a child subreaper in the worker's
	// PID namespace and kills the tree it has collected itself.
	ModeSubreaper Mode = "subreaper"
	// ModeDirect: no launcher (platforms other than Linux): the runtime is
	// started in its own process group and only that group is killed.
	ModeDirect Mode = "direct"
)

// ErrLauncher reports that the launcher itself failed (it could not be
// started or did not report how the runtime ended).
var ErrLauncher = errors.New("sandbox: launcher failed")
