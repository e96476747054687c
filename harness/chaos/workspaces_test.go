//go:build linux

package chaos_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/harness/chaos"
)

// What workers the soak SIGKILLed leave in their workspace root, as root:
// a run's workspace with its own filesystem mounted, the empty filesystem
// of a worker killed while it mounted one, a parked spare, and beside them
// a mount that is no workspace. Once no worker runs, the soak's clear-up
// sweeps the three workspaces away as a worker would, detaches the other
// mount by force and names it, and removes the root: nothing of the soak
// stays mounted.
func TestClearWorkspacesLeavesNoMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a root worker mounts its runs' workspace filesystems")
	}
	root := filepath.Join(t.TempDir(), "ws")
	mount := func(dir string, agora bool) {
		t.Helper()
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0700"); err != nil {
			t.Fatalf("mount a tmpfs on %s: %v", dir, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
		if agora {
			if err := os.MkdirAll(filepath.Join(dir, ".agora", "artifacts"), 0o700); err != nil {
				t.Fatal(err)
			}
		}
	}
	folder := func(name string) string {
		t.Helper()
		dir := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Join(dir, ".agora", "artifacts"), 0o700); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	mount(folder("run.1.11"), true)    // a run whose worker was killed
	mount(folder("mount.1.12"), false) // a worker killed mid-mount
	folder("spare.0.13")               // a killed worker's parked workspace
	other := filepath.Join(root, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	mount(other, false)

	swept, left, err := chaos.ClearWorkspaces(root, 500*time.Millisecond)
	if err != nil {
		t.Errorf("ClearWorkspaces: %v", err)
	}
	if swept != 3 {
		t.Errorf("%d workspaces swept, want 3", swept)
	}
	if !slices.Equal(left, []string{other}) {
		t.Errorf("mounts left to detach by force: %q, want only %s", left, other)
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), root) {
		t.Errorf("a mount under %s remains:\n%s", root, b)
	}
	if _, err := os.Lstat(root); !os.IsNotExist(err) {
		t.Errorf("the workspace root is still there (%v)", err)
	}
}
