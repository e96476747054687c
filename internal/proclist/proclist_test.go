package proclist_test

import (
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/agora-dispatch/agora/internal/proclist"
)

// A process started with a marker in its argv is found while it lives and
// not after it has been reaped.
func TestWithMarker(t *testing.T) {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("no /proc here")
	}
	marker := "proclist-test-marker-" + t.Name()
	cmd := exec.Command("/bin/sh", "-c", "cat >/dev/null", marker)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if pids := proclist.WithMarker(marker); !slices.Contains(pids, cmd.Process.Pid) {
		t.Errorf("WithMarker(%q) = %v, want it to hold %d", marker, pids, cmd.Process.Pid)
	}
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if pids := proclist.WithMarker(marker); len(pids) != 0 {
		t.Errorf("WithMarker(%q) after the process ended = %v, want none", marker, pids)
	}
}
