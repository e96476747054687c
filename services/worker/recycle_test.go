//go:build linux

package worker_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// wsView is what a probe run saw of its workspace.
type wsView struct {
	listing []string // "<type> <mode> <path>", sorted
	xattrs  []string // paths that carry extended attributes
	btime   unix.StatxTimestamp
	hasTime bool
}

// recycleRuntime is a sub-agent run in the worker's process: "probe"
// records its workspace, the others leave things behind in it the way a
// hostile or careless sub-agent would.
type recycleRuntime struct {
	t     *testing.T
	mu    sync.Mutex
	views map[string]wsView // by dispatch id
	xattr bool              // tamper-xattr could set one
}

func (r *recycleRuntime) Run(_ context.Context, inv worker.Invocation) worker.Result {
	ws := inv.Workspace
	must := func(err error) {
		if err != nil {
			r.t.Errorf("%s: %v", inv.Definition.Name, err)
		}
	}
	switch inv.Definition.Name {
	case "probe":
		var v wsView
		must(filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(ws, p)
			v.listing = append(v.listing, fi.Mode().String()+" "+rel)
			if n, err := unix.Llistxattr(p, nil); err == nil && n > 0 {
				v.xattrs = append(v.xattrs, rel)
			}
			return nil
		}))
		slices.Sort(v.listing)
		var stx unix.Statx_t
		if unix.Statx(unix.AT_FDCWD, ws, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME, &stx) == nil && stx.Mask&unix.STATX_BTIME != 0 {
			v.btime, v.hasTime = stx.Btime, true
		}
		r.mu.Lock()
		r.views[inv.Request.DispatchID] = v
		r.mu.Unlock()
	case "litter": // all of it removable: the workspace can be cleared
		must(os.WriteFile(filepath.Join(ws, "top.txt"), []byte("secret of the last run"), 0o644))
		must(os.WriteFile(filepath.Join(ws, ".hidden"), []byte("x"), 0o600))
		must(os.MkdirAll(filepath.Join(ws, "a", "b", "c"), 0o755))
		must(os.WriteFile(filepath.Join(ws, "a", "b", "c", "deep.txt"), []byte("x"), 0o600))
		must(os.Chmod(filepath.Join(ws, "a", "b"), 0))
		must(syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o600))
		must(os.Symlink("/etc", filepath.Join(ws, "etc-link")))
		must(os.WriteFile(filepath.Join(ws, ".agora", "tmp", "scratch"), []byte("x"), 0o600))
		must(os.MkdirAll(filepath.Join(ws, ".agora", "home", ".cache", "x"), 0o700))
		must(os.WriteFile(filepath.Join(ws, ".agora", "home", ".bashrc"), []byte("evil"), 0o600))
		must(os.WriteFile(filepath.Join(ws, ".agora", "progress.jsonl"), []byte("{}\n"), 0o600))
		must(os.WriteFile(filepath.Join(ws, ".agora", "extra"), []byte("x"), 0o600))
	case "tamper-link": // .agora/tmp becomes a link out of the workspace
		must(os.Remove(filepath.Join(ws, ".agora", "tmp")))
		must(os.Symlink(r.t.TempDir(), filepath.Join(ws, ".agora", "tmp")))
	case "tamper-mode": // a directory another run would inherit, opened up
		must(os.Chmod(filepath.Join(ws, ".agora", "home"), 0o777))
	case "tamper-xattr": // data hidden in an attribute of a kept directory
		err := unix.Setxattr(filepath.Join(ws, ".agora", "artifacts"), "user.agora-test", []byte("left for the next run"), 0)
		r.mu.Lock()
		r.xattr = err == nil
		r.mu.Unlock()
	}
	return worker.Result{}
}

// TestWorkspaceRecycling: a workspace whose run left only what can be
// removed is cleared and reused by the next run; one whose run changed
// what would be kept (a link, a mode, an extended attribute) is removed.
// Either way the next run finds exactly a fresh workspace.
func TestWorkspaceRecycling(t *testing.T) {
	h := newHarness(t, provision.Config{})
	rt := &recycleRuntime{t: t, views: map[string]wsView{}}
	cfg := h.workerConfig()
	cfg.Concurrency = 1 // one slot, so one parked workspace, taken by the next run
	// Recycling is of the workspace folder on disk; a run's own filesystem
	// (AGORA_SANDBOX_WORKSPACE=tmpfs) is made anew over it each run.
	cfg.SandboxWorkspace = "watch"
	h.startWorker(cfg, worker.Deps{InProcess: map[string]worker.InProcess{subagent.RuntimeExec: rt}})
	for _, name := range []string{"probe", "litter", "tamper-link", "tamper-mode", "tamper-xattr"} {
		h.define(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"in-process"}})
	}
	run := func(name string) string {
		t.Helper()
		id := h.dispatch(lifecycle.Request{Subagent: name, Input: []byte(`{}`)})
		if k := h.terminal(id).Data.(lifecycle.Lifecycle).LifecycleKind(); k != lifecycle.KindFinished {
			t.Fatalf("%s ended %s", name, k)
		}
		return id
	}
	probe := func() wsView {
		t.Helper()
		id := run("probe")
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return rt.views[id]
	}
	fresh := []string{
		"-rw------- .agora/input.json",
		"drwx------ .",
		"drwx------ .agora",
		"drwx------ .agora/artifacts",
		"drwx------ .agora/home",
		"drwx------ .agora/tmp",
	}
	check := func(step string, v wsView) {
		t.Helper()
		if !slices.Equal(v.listing, fresh) {
			t.Errorf("%s: the workspace holds\n%s\nwant\n%s", step, strings.Join(v.listing, "\n"), strings.Join(fresh, "\n"))
		}
		if len(v.xattrs) > 0 {
			t.Errorf("%s: extended attributes on %v", step, v.xattrs)
		}
	}
	first := probe()
	check("first run", first)
	if !first.hasTime {
		t.Log("no birth times on this file system: reuse itself is not checked, only what each run finds")
	}
	same := func(a, b wsView) bool { return a.hasTime && b.hasTime && a.btime == b.btime }

	run("litter")
	v := probe()
	check("after a run that left files, links, a FIFO and an unreadable folder", v)
	if first.hasTime && !same(first, v) {
		t.Errorf("after litter: a new workspace (born %v, first %v): the cleared one was not reused", v.btime, first.btime)
	}
	for _, name := range []string{"tamper-link", "tamper-mode", "tamper-xattr"} {
		before := probe()
		run(name)
		after := probe()
		check("after "+name, after)
		rt.mu.Lock()
		skip := name == "tamper-xattr" && !rt.xattr
		rt.mu.Unlock()
		if skip {
			t.Log("tamper-xattr: this file system takes no user attributes")
			continue
		}
		if same(before, after) {
			t.Errorf("after %s: the tampered workspace was reused", name)
		}
	}
	// Nothing is left under the root but what is parked, and the sweep's
	// own names are all it uses. A run's workspace is cleared after its
	// terminal event, so the last one may still be on its way.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, err := os.ReadDir(h.root)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		var left []string
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "spare.0.") {
				left = append(left, e.Name())
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left under the root: %v", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
