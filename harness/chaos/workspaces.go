package chaos

import (
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/services/worker"
)

// clearWorkspaces empties the soak's workspace root once no worker runs on
// it any more. A worker the soak SIGKILLed leaves its runs' workspaces —
// as root, each with its own filesystem mounted — until a worker on the
// same root sweeps them, and none does after the soak. So the soak sweeps
// as a worker does (worker.SweepWorkspaces), again until nothing is
// mounted under root or within passes (a workspace goes once the last
// process holding its lock, a launcher, is gone), then detaches what is
// still mounted there and removes root. It returns how many workspaces the
// sweeps removed and the mounts they left, which it detached by force.
func clearWorkspaces(root string, within time.Duration) (swept int, left []string, err error) {
	log := slog.New(slog.DiscardHandler)
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		swept += worker.SweepWorkspaces(root, log)
		left = mountsUnder(root)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	// The deepest first: a mount on top of another goes before it.
	slices.SortFunc(left, func(a, b string) int { return len(b) - len(a) })
	for _, m := range left {
		detach(m)
	}
	return swept, left, os.RemoveAll(root)
}

// mountsUnder lists the mount points of this process's mount namespace
// below root.
func mountsUnder(root string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if p := unescapeMount(f[4]); strings.HasPrefix(p, root+"/") {
			out = append(out, p)
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
