package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agora-dispatch/agora/internal/sandbox"
)

// LayerRow is the cost of the sandbox's layers, added one at a time: the
// launcher running /bin/true serially with each policy (docs/sandbox.md,
// "Cost").
type LayerRow struct {
	Layers string  `json:"layers"`
	Mode   string  `json:"mode"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
	// AddedMS is this row's p50 less the previous row's.
	AddedMS float64 `json:"added_ms"`
	// CPUMS is the CPU one run took in this process and its children (the
	// spawner and the launchers: cpuTime), MachineCPUMS the time all CPUs
	// were busy per run (/proc/stat), which also counts the kernel's own
	// threads, such as those that free a network namespace after its last
	// process, and whatever else the machine ran meanwhile.
	CPUMS        float64 `json:"cpu_ms"`
	MachineCPUMS float64 `json:"machine_cpu_ms"`
}

// sandboxLayers measures the launcher alone, layer by layer, in the mode
// New picks on this host and, for comparison, in a PID namespace only (the
// v0.2 launcher's containment). samples runs per row.
func sandboxLayers(ctx context.Context, wsRoot string, samples int) ([]LayerRow, error) {
	ws, err := os.MkdirTemp(wsRoot, "layers-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(ws)
	sys := []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}
	var binds []sandbox.Bind
	for _, d := range append(slices.Clone(sys), "/sbin", "/opt") {
		binds = append(binds, sandbox.Bind{Host: d, Target: d})
	}
	binds = append(binds, sandbox.Bind{Host: ws, Target: ws, Write: true})
	landlock := sandbox.Policy{Landlock: true, ReadDirs: sys, WriteDirs: []string{ws}, WriteFiles: []string{"/dev/null"}}
	type step struct {
		name  string
		pol   sandbox.Policy
		binds bool
	}
	full := landlock
	full.Root, full.Loopback, full.Seccomp = true, true, true
	nsSteps := []step{
		{"launcher only (user, PID, mount, network, IPC, UTS namespaces)", sandbox.Policy{}, false},
		{"+ a root of its own", sandbox.Policy{Root: true}, true},
		{"+ loopback up", sandbox.Policy{Root: true, Loopback: true}, true},
		{"+ seccomp", sandbox.Policy{Root: true, Loopback: true, Seccomp: true}, true},
		{"+ Landlock on every thread and the runtime's own domain (all layers)", full, true},
	}
	var rows []LayerRow
	for _, m := range []sandbox.Mode{sandbox.ModePIDNamespace, sandbox.ModeNamespaces} {
		l, err := sandbox.NewMode(sandbox.Options{}, m)
		if err != nil {
			continue // the host lacks it: no row
		}
		steps := nsSteps
		if m == sandbox.ModePIDNamespace {
			steps = []step{{"launcher only (PID and mount namespaces)", sandbox.Policy{}, false}, {"+ Landlock", landlock, false}}
		}
		if m == sandbox.ModeNamespaces {
			if err := os.Chown(ws, l.Host().RunUID, l.Host().RunUID); err != nil {
				l.Close()
				return nil, err
			}
		}
		prev := 0.0
		for _, st := range steps {
			var b []sandbox.Bind
			dir := "/" // the run's user may not reach ws without a root of its own
			if st.binds {
				b, dir = binds, ws
			}
			var lat []time.Duration
			cpu0, mach0 := cpuTime(), machineCPU()
			for range samples {
				start := time.Now()
				r := l.Run(ctx, sandbox.Spec{Path: "/bin/true", Args: []string{"true"}, Dir: dir, KillGrace: time.Second, Policy: st.pol, Binds: b})
				lat = append(lat, time.Since(start))
				if r.Err != nil || r.ExitCode != 0 {
					l.Close()
					return nil, fmt.Errorf("bench: sandbox layers %s: %+v", st.name, r)
				}
			}
			cpu, mach := cpuTime()-cpu0, machineCPU()-mach0
			slices.Sort(lat)
			row := LayerRow{Layers: st.name, Mode: string(m), P50MS: ms(lat[len(lat)/2]), P99MS: ms(lat[len(lat)*99/100]),
				CPUMS: ms(cpu) / float64(samples), MachineCPUMS: ms(mach) / float64(samples)}
			if prev > 0 {
				row.AddedMS = row.P50MS - prev
			}
			prev = row.P50MS
			rows = append(rows, row)
		}
		l.Close()
	}
	// A workspace of its own: the launcher's belongs to the run's user.
	bws, err := os.MkdirTemp(wsRoot, "bwrap-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(bws)
	if row, ok, err := bubblewrap(ctx, sys, bws, samples); err != nil {
		return nil, err
	} else if ok {
		rows = append(rows, row)
	}
	return rows, nil
}

// bubblewrap measures the anchor Claude Code's and Codex's Linux sandboxes
// build on: the same /bin/true under bwrap (Debian's bubblewrap) with the
// namespaces of the launcher's namespaces mode, a root of its own with the
// same system folders and the workspace bound, loopback up, in the same
// run as the launcher's rows. ok is false without bwrap (no row).
func bubblewrap(ctx context.Context, sys []string, ws string, samples int) (LayerRow, bool, error) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return LayerRow{}, false, nil
	}
	args := []string{"--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
		"--dev", "/dev", "--proc", "/proc", "--bind", ws, ws, "--chdir", ws}
	for _, d := range append(slices.Clone(sys), "/sbin", "/opt") {
		args = append(args, "--ro-bind-try", d, d)
	}
	args = append(args, "/bin/true")
	var lat []time.Duration
	cpu0, mach0 := cpuTime(), machineCPU()
	for range samples {
		start := time.Now()
		if out, err := exec.CommandContext(ctx, bwrap, args...).CombinedOutput(); err != nil {
			return LayerRow{}, false, fmt.Errorf("bench: bubblewrap: %v: %s", err, out)
		}
		lat = append(lat, time.Since(start))
	}
	cpu, mach := cpuTime()-cpu0, machineCPU()-mach0
	slices.Sort(lat)
	return LayerRow{Layers: "bubblewrap " + bwrapVersion(bwrap) + ": the same namespaces, a root of its own, loopback up (the anchor; no seccomp, no Landlock)",
		Mode: "bwrap", P50MS: ms(lat[len(lat)/2]), P99MS: ms(lat[len(lat)*99/100]),
		CPUMS: ms(cpu) / float64(samples), MachineCPUMS: ms(mach) / float64(samples)}, true, nil
}

// bwrapVersion is bwrap --version's number ("0.8.0"), or "".
func bwrapVersion(bwrap string) string {
	out, err := exec.Command(bwrap, "--version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "bubblewrap"))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// printLayers prints the sandbox layers' table.
func printLayers(w io.Writer, rows []LayerRow, wide bool) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "sandbox layers (launcher alone, /bin/true, serial)\tmode\tp50 ms\tp99 ms\t+ p50 ms\tCPU ms each\tmachine CPU ms each")
	} else {
		fmt.Fprintln(w, "sandbox layers (launcher alone, /bin/true, serial):")
		fmt.Fprintln(tw, "#\tmode\tp50 ms\tp99 ms\t+ p50 ms\tCPU ms\tmachine CPU ms")
	}
	for i, r := range rows {
		added := "-"
		if r.AddedMS != 0 {
			added = fmt.Sprintf("%+.3f", r.AddedMS)
		}
		name := r.Layers
		if !wide {
			name = "L" + strconv.Itoa(i+1)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%s\t%.2f\t%.2f\n", name, r.Mode, r.P50MS, r.P99MS, added, r.CPUMS, r.MachineCPUMS)
	}
	tw.Flush()
	if !wide {
		for i, r := range rows {
			fmt.Fprintln(w, wrap(fmt.Sprintf("L%-2d ", i+1), r.Layers, 100))
		}
	}
}

// machineCPU is the time the machine's CPUs have been busy so far: the
// first line of /proc/stat less its idle, I/O-wait and steal times; 0
// when it cannot be read.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 7 { // idle, iowait, steal (another guest's); guest time is in user already
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0
		}
		busy += n
	}
	return clockTicks(busy)
}
