// Package contain turns a sub-agent's definition into a contained run
// (docs/sandbox.md): the launcher policy its sandbox block asks for — the
// system paths the run's root shows, its binds, limits, network and egress
// proxy — the per-run cgroups that bound processes and memory where the
// worker may make them, the report a run's `started` event carries, and
// what a run that passed a limit or could not start says about it.
// CheckDefinition resolves, ahead of any run, what a run of a definition
// executes and whether its root shows it (`agora subagent check`).
//
// A worker builds one Host and asks it for a Box per run: the Box is
// resolved from the definition at once (Report), laid out once the
// workspace exists (Prepare), run through the sandbox launcher (Run) and
// given back (Close). The workspace itself — its folder, lock and own
// filesystem — is the worker's.
package contain

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"time"

	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Options configure a Host. Every field but Launcher is optional.
type Options struct {
	// Launcher starts every run (internal/sandbox). The caller owns it and
	// closes it once no run is left.
	Launcher *sandbox.Launcher
	// Egress is the template of every run's egress proxy: its Dialer,
	// Resolver and AllowPrivate reach runs' proxies; Allow comes from each
	// definition.
	Egress egress.Config
	// Helper is the agora binary runs find as `agora` on their PATH
	// (AGORA_SANDBOX_HELPER); empty means Exe when it is agora, else agora
	// next to it.
	Helper string
	// Exe is the worker's own executable, which every run's root shows
	// (it serves the require_input MCP tool); empty when unknown.
	Exe string
	// WatchWorkspace keeps every run's workspace on the worker's disk with
	// its size watched, never a filesystem of its own
	// (AGORA_SANDBOX_WORKSPACE=watch, or a worker that keeps workspaces).
	WatchWorkspace bool
}

// Host contains the runs of one worker. It is safe for concurrent use.
type Host struct {
	launcher *sandbox.Launcher
	egress   egress.Config
	helper   string // the agora binary runs find on their PATH; "" none
	exe      string
	watch    bool
	cgroups  bool        // per-run cgroups can be made
	pool     *cgroupPool // cgroup sets reused across runs
}

// New prepares the containment of a worker's runs: it probes whether
// per-run cgroups can be made and finds the agora helper. It starts
// nothing.
func New(o Options) *Host {
	return &Host{
		launcher: o.Launcher, egress: o.Egress, exe: o.Exe, watch: o.WatchWorkspace,
		cgroups: cgroupsUsable(),
		helper:  findHelper(o.Helper, o.Exe),
		// Named by this process and instance: a live worker's cgroups are
		// never another's to remove.
		pool: &cgroupPool{name: fmt.Sprintf("%d-%x", os.Getpid(), rand.Uint32())},
	}
}

// Cgroups reports whether runs get their own cgroups (processes and
// memory bounded as a whole).
func (h *Host) Cgroups() bool { return h.cgroups }

// SweepCgroups removes the cgroups that workers which are gone left
// behind on this host.
func (h *Host) SweepCgroups() {
	if h.cgroups {
		removeStale()
	}
}

// Close removes the host's own cgroups, once no run of it is left.
func (h *Host) Close() {
	if h.cgroups {
		h.pool.removeAll()
	}
}

// WorkspaceFS is how a run's workspace_size holds (docs/sandbox.md, "The
// workspace's own filesystem").
type WorkspaceFS int

const (
	// WorkspaceUnbounded: nothing to hold (mode off, or no workspace_size).
	WorkspaceUnbounded WorkspaceFS = iota
	// WorkspaceWatched: the worker checks the workspace's size once a
	// second and stops a run past it.
	WorkspaceWatched
	// WorkspaceMount: the worker (root) mounts a tmpfs of workspace_size
	// on the workspace before the run.
	WorkspaceMount
	// WorkspaceLauncher: the launcher makes that tmpfs inside the run's
	// mount namespace (a worker that is not root) and hands its root over
	// through the run's Spec.Workspace.
	WorkspaceLauncher
)

// Box is one run's sandbox, from its definition to its end. Its methods
// are called by the run's own goroutine, in order: Report and the other
// accessors at any time, Prepare once the workspace exists, Run, the notes
// and Exceeded once the run is over, Close last.
type Box struct {
	host        *Host
	def         subagent.Definition
	isolation   sandbox.Mode
	mode        string
	limits      subagent.Resolved
	fs          WorkspaceFS
	runUID      int      // the run's host uid; 0: the worker's own
	egress      []string // the proxy's allow rules; none: no proxy
	ports       []int
	useCgroups  bool
	privateProc bool
	report      *lifecycle.Sandbox
	log         *slog.Logger

	// Laid out by Prepare.
	policy  sandbox.Policy
	binds   []sandbox.Bind
	cgroups []string
	env     map[string]string
	proxy   *egress.Proxy
	cgset   *cgroupSet // the run's, while it runs
}

// Box resolves a run's sandbox from its definition: mode, limits and the
// report for `started`. timeout is the run's time limit (the default
// cpu_time); log receives the lines of its egress proxy.
func (h *Host) Box(def subagent.Definition, timeout time.Duration, log *slog.Logger) *Box {
	sb := def.Sandbox
	b := &Box{host: h, def: def, mode: sb.ModeOrDefault(), limits: sb.Limits.Resolve(timeout), env: map[string]string{}, ports: sb.Ports(),
		isolation: h.launcher.Mode(), egress: egressRules(sb), log: log}
	b.fs = b.workspaceFS()
	host := h.launcher.Host()
	if b.isolation == sandbox.ModeNamespaces && host.RunUID != os.Geteuid() && b.mode != subagent.SandboxOff {
		b.runUID = host.RunUID
	}
	b.report = &lifecycle.Sandbox{Mode: b.mode, Isolation: string(h.launcher.Mode()), LandlockABI: host.LandlockABI}
	if b.mode == subagent.SandboxOff {
		b.report.Isolation = string(h.launcher.UnconfinedMode())
		return b
	}
	l := b.limits
	b.useCgroups = h.cgroups && (l.Processes > 0 || l.Memory > 0)
	limits := map[string]int64{"memory": l.Memory, "open_files": l.OpenFiles, "file_size": l.FileSize,
		"workspace_size": l.WorkspaceSize, "cpu_time": int64(l.CPUTime / time.Second), "processes": l.Processes}
	if l.CPUTime == 0 {
		limits["cpu_time"] = subagent.Unlimited
	}
	if !b.useCgroups && !b.nprocLimit() {
		// Without a cgroup or a user namespace of its own the process
		// count is not bounded (RLIMIT_NPROC would count every process
		// of the user, the worker's included).
		limits["processes"] = subagent.Unlimited
	}
	b.report.Filesystem = host.LandlockABI >= 1
	b.report.Network = host.LandlockABI >= 4
	b.report.PrivateProc = host.PrivateProc
	b.report.Cgroup = b.useCgroups
	b.report.Limits = limits
	if b.report.Network {
		b.report.TCPPorts = b.ports
		if b.report.TCPPorts == nil {
			b.report.TCPPorts = []int{}
		}
	}
	b.privateProc = host.PrivateProc
	if b.isolation == sandbox.ModeNamespaces {
		b.report.NetworkNamespace, b.report.OwnRoot, b.report.Seccomp, b.report.NoCapabilities = true, true, true, true
		b.report.Egress = b.egress
		b.report.WorkspaceFS = "watched"
		if b.fs == WorkspaceMount || b.fs == WorkspaceLauncher {
			b.report.WorkspaceFS = "tmpfs"
		}
	}
	return b
}

// workspaceFS decides how the run's workspace_size holds: a filesystem of
// its own where runs have namespaces of their own — mounted by a root
// worker, made by the launcher of one that is not — else watched.
func (b *Box) workspaceFS() WorkspaceFS {
	if b.mode == subagent.SandboxOff || b.limits.WorkspaceSize <= 0 {
		return WorkspaceUnbounded
	}
	switch {
	case b.isolation != sandbox.ModeNamespaces || b.host.watch:
		return WorkspaceWatched
	case os.Geteuid() == 0:
		return WorkspaceMount
	}
	return WorkspaceLauncher
}

// Report is what `started.sandbox` says of the run.
func (b *Box) Report() *lifecycle.Sandbox { return b.report }

// Off reports whether the definition turns the sandbox off (mode off):
// the run gets only the launcher's process-tree containment.
func (b *Box) Off() bool { return b.mode == subagent.SandboxOff }

// Limits are the run's limits in force.
func (b *Box) Limits() subagent.Resolved { return b.limits }

// WorkspaceFS is how the run's workspace_size holds.
func (b *Box) WorkspaceFS() WorkspaceFS { return b.fs }

// RunUID is the host uid the run's processes have when it is not the
// worker's own, so that the worker hands the run its workspace; 0 when
// the run keeps the worker's uid.
func (b *Box) RunUID() int { return b.runUID }

// Env are the variables the run gets from its box, set over its own
// environment: its PATH with the agora helper's folder first, and the
// egress proxy's. Prepare fills it.
func (b *Box) Env() map[string]string { return b.env }

// EgressStats are the counters of the run's egress proxy, once the run
// is over; false when it had none.
func (b *Box) EgressStats() (egress.Stats, bool) {
	if b == nil || b.proxy == nil {
		return egress.Stats{}, false
	}
	return b.proxy.Stats(), true
}

// Result is how a contained run ended.
type Result struct {
	// ExitCode is the runtime's exit code, or -1 when a signal ended it
	// or it never started; Signal names the signal, if one did.
	ExitCode int
	Signal   string
	// Err is set when the runtime could not be started or the launcher
	// failed.
	Err error
	// Exceeded names the limit the run went over, as Exceeded does.
	Exceeded string
}

// Run runs the runtime cmd names — its Path, Args, Env, Dir, Stdout,
// Stderr, KillGrace, Hold and Workspace; the box sets the rest of the
// spec — in the box through the sandbox launcher, which owns the runtime's
// whole process tree: when ctx ends the runtime's process group gets
// SIGTERM and everything is killed after cmd.KillGrace. cmd.Workspace is
// given the root of the workspace's own filesystem when the launcher makes
// it (WorkspaceLauncher). Run blocks until the tree is gone.
func (b *Box) Run(ctx context.Context, cmd sandbox.Spec) Result {
	spec := sandbox.Spec{
		Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir,
		Stdout: cmd.Stdout, Stderr: cmd.Stderr, KillGrace: cmd.KillGrace, Hold: cmd.Hold,
		Unconfined: b.Off(),
	}
	if !spec.Unconfined {
		spec.Policy, spec.Cgroups = b.policy, b.cgroups
		spec.Binds = append(slices.Clone(b.binds), sandbox.Bind{Host: cmd.Path, Target: cmd.Path})
		if spec.Policy.Landlock {
			// The runtime's own executable, wherever the definition put it.
			spec.Policy.ReadFiles = append(slices.Clone(spec.Policy.ReadFiles), cmd.Path)
		}
		if px := b.proxy; px != nil {
			spec.Proxy = func(ctx context.Context, ln net.Listener) { _ = px.Serve(ctx, ln) }
		}
		if b.fs == WorkspaceLauncher {
			spec.Workspace = cmd.Workspace
		}
	}
	r := b.host.launcher.Run(ctx, spec)
	return Result{ExitCode: r.ExitCode, Signal: r.Signal, Err: r.Err, Exceeded: b.Exceeded(r.Signal)}
}

// Close hands the run's cgroups back to the host: the launcher is gone,
// so are their processes.
func (b *Box) Close() {
	if b == nil || b.cgset == nil {
		return
	}
	b.host.pool.put(b.cgset)
	b.cgset = nil
}
