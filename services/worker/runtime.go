package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/internal/sandbox/contain"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Invocation is one run of a sub-agent: what the worker knows of it.
type Invocation struct {
	Definition subagent.Definition
	Request    lifecycle.Request
	// Input is the whole input object written to .agora/input.json,
	// including answer and partial_state on a resume.
	Input     map[string]json.RawMessage
	Workspace string
	// Env is the complete default-deny environment of the sub-agent.
	Env []string
	// KillGrace is the time between SIGTERM and SIGKILL when ctx ends.
	KillGrace time.Duration

	box    *contain.Box // the run's sandbox, which starts the runtime
	fs     *runFS       // the filesystem the run writes to (wsfs.go)
	hold   *os.File     // the workspace lock, kept by the launcher
	helper runtime.Helper
	args   []string // the runtime's command line (prepare)
}

// public is the invocation as a runtime sees it (pkg/runtime).
func (inv Invocation) public() runtime.Invocation {
	return runtime.Invocation{Definition: inv.Definition, Request: inv.Request, Input: inv.Input, Workspace: inv.Workspace, Env: inv.Env, Helper: inv.helper}
}

// Result is how a runtime ended.
type Result struct {
	// ExitCode is the process exit code, or -1 when it was killed by a
	// signal or never started.
	ExitCode int
	// Stdout and Stderr hold the last 4 KiB of each stream.
	Stdout, Stderr []byte
	// Err is set when the runtime could not be started or waited for
	// (an adapter error, not the sub-agent's own failure).
	Err error
	// Signal names the signal that ended the runtime, if one did.
	Signal string

	exceeded string // the limit the run's box saw passed (contain.Box.Exceeded)
}

// InProcess is Go code the worker runs in its own process in place of a
// sub-agent's command, for tests and benches that measure Agora without
// a process per run: nothing confines it, since it is the worker's own
// code. Run blocks until the run is over; when ctx ends it returns
// promptly. Sub-agents run through a runtime.Runtime, whose command only
// the worker starts, in the sandbox.
type InProcess interface {
	Run(ctx context.Context, inv Invocation) Result
}

// runCommand runs argv in the run's box, through the sandbox launcher,
// which owns the runtime's whole process tree: when ctx ends the runtime's
// process group gets SIGTERM and everything is killed after the grace
// period, and nothing the sub-agent started outlives the run
// (internal/sandbox/contain).
func runCommand(ctx context.Context, inv Invocation, argv []string) Result {
	if len(argv) == 0 || argv[0] == "" {
		return Result{ExitCode: -1, Err: errors.New("worker: empty command")}
	}
	if inv.box == nil {
		return Result{ExitCode: -1, Err: errors.New("worker: no launcher for this invocation")}
	}
	path, err := lookPath(argv[0], inv.Env, inv.Workspace)
	if err != nil {
		return Result{ExitCode: -1, Err: err}
	}
	stdout, stderr := newTail(tailSize), newTail(tailSize)
	cmd := sandbox.Spec{
		Path: path, Args: argv, Env: inv.Env, Dir: inv.Workspace,
		Stdout: stdout, Stderr: stderr, KillGrace: inv.KillGrace, Hold: inv.fs.launcherHold(inv.hold),
		Workspace: inv.fs.setView,
	}
	uid := inv.box.RunUID()
	if err := giveWorkspace(inv.Workspace, uid); err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("worker: sandbox: workspace: %w", err)}
	}
	defer takeWorkspace(inv.Workspace, uid)
	r := inv.box.Run(ctx, cmd)
	res := Result{ExitCode: r.ExitCode, Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Signal: r.Signal, exceeded: r.Exceeded}
	if r.Err != nil {
		res.Err = fmt.Errorf("worker: start %s: %w", argv[0], r.Err)
	}
	return res
}

// lookPath resolves argv[0] against the sub-agent's own PATH (not the
// worker's) and its workspace for relative paths.
func lookPath(name string, env []string, dir string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("worker: command %q: %w", name, err)
		}
		return p, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("worker: command %q not found on the sub-agent's PATH", name)
}

const tailSize = 4 << 10

// tail keeps the last n bytes written to it.
type tail struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func newTail(n int) *tail { return &tail{n: n} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.n {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.n:]...)
	}
	return len(p), nil
}

func (t *tail) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if len(b) > t.n {
		b = b[len(b)-t.n:]
	}
	return bytes.Clone(b)
}

var _ io.Writer = (*tail)(nil)
