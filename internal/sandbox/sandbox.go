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
	"context"
	"errors"
	"io"
	"net"
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
	// (Landlock, resource limits, the run's own root, network and seccomp
	// filter).
	Policy Policy
	// Binds are the host paths the run's root shows (Policy.Root). The
	// worker opens each and sends the descriptor, so no path of the
	// worker's need be reachable by the run's user; a path that does not
	// exist is left out.
	Binds []Bind
	// Cgroups are cgroup.procs files the worker puts the launcher in
	// before the run starts, so that the runtime and all it starts are in
	// them.
	Cgroups []string
	// Proxy, when set with Policy.ProxyPort, serves the run's egress proxy
	// on the listener the launcher made inside the run's network
	// namespace; it runs until its context ends (the run is over).
	Proxy func(ctx context.Context, ln net.Listener)
	// Workspace, when set, is given the workspace's own filesystem the
	// launcher made (Policy.Workspace), as a descriptor of its root: the
	// run's results are read through it, also after the launcher is gone.
	// The callee owns the file.
	Workspace func(root *os.File)
	// Unconfined runs the runtime with only the launcher's process-tree
	// containment (mode off): the worker's own user, network and root.
	Unconfined bool
}

// Bind is one host path the run's root shows at Target (usually the same
// path), read-only unless Write.
type Bind struct {
	Host, Target string
	Write        bool
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
	// UserNamespace and NetworkNamespace tell whether each run gets a
	// user namespace (its user unprivileged on the host, RunUID) and a
	// network namespace of its own with only loopback.
	UserNamespace    bool `json:"user_namespace"`
	NetworkNamespace bool `json:"network_namespace"`
	// Seccomp tells whether this build has the run's seccomp filter for
	// the host's architecture.
	Seccomp bool `json:"seccomp"`
	// RunUID is the host uid a run's processes have (ModeNamespaces).
	RunUID int `json:"run_uid,omitempty"`
}

// Options configure a Launcher.
type Options struct {
	// Bin is the launcher binary; empty means Executable's choice.
	Bin string
	// RunUID is the unprivileged host uid (and gid) a root worker's runs
	// are mapped to; 0 means DefaultRunUID; OwnUID keeps the worker's own
	// (a root worker's runs are then uid 0 on the host, without any
	// capability: for tests and single-user machines). A worker that is
	// not root always maps runs to its own uid.
	RunUID int
}

// RunUID is the uid (and gid) a run's processes have inside their user
// namespace; DefaultRunUID is the host uid it maps to under a root worker.
const (
	RunUID        = 1000
	DefaultRunUID = 1000000000
	OwnUID        = -1
)

func (o Options) runUID() int {
	switch {
	case o.RunUID == OwnUID:
		return os.Geteuid()
	case o.RunUID > 0:
		return o.RunUID
	}
	return DefaultRunUID
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
	// ModeNamespaces: the launcher is PID 1 of new user, PID, mount,
	// network, IPC and UTS namespaces, as an unprivileged host user; it
	// builds the run a root of its own and the runtime runs with no
	// capability (docs/sandbox.md). A sandboxed run needs it.
	ModeNamespaces Mode = "namespaces"
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
