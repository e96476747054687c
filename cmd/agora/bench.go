package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/harness/bench"
)

func newBenchCmd() *cobra.Command {
	var cfg bench.Config
	var hcfg bench.HistoryConfig
	var pcfg bench.PendingConfig
	var dcfg bench.DepthConfig
	var lcfg bench.LongConfig
	var ccfg bench.CoalesceConfig
	var asJSON, wide bool
	var cpuProfile, idleProfile, scale string
	var deadline time.Duration
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure Agora against a raw JetStream baseline in the same run",
		Long: `bench starts an embedded NATS server with file storage and measures, in one run:
a raw JetStream baseline (request → consumer → started+finished → observer) and
Agora's worker path with an in-process no-op runtime and with exec /bin/true,
the end-to-end path with tracing on (every span exported over OTLP/HTTP to a
receiver in this process; --breakdown prints each stage's timings from them),
artifact upload and resume latency (with --breakdown, resume once more with
tracing on, for the stages of each answer's trace).
It prints p50/p99 latency of serial round trips, throughput with --concurrency
in flight, each figure's ratio to the baseline, and the peak memory.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			progress := cmd.ErrOrStderr()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			cfg.Deadline, hcfg.Deadline, pcfg.Deadline, dcfg.Deadline, lcfg.Deadline, ccfg.Deadline = deadline, deadline, deadline, deadline, deadline, deadline
			switch scale {
			case "":
			case "history":
				return printReport(cmd, asJSON, bench.PrintHistory)(bench.History(cmd.Context(), hcfg, progress))
			case "pending":
				if idleProfile != "" {
					f, err := os.Create(idleProfile)
					if err != nil {
						return err
					}
					defer f.Close()
					pcfg.IdleProfile = f
				}
				return printReport(cmd, asJSON, bench.PrintPending)(bench.Pending(cmd.Context(), pcfg, progress))
			case "depth":
				return printReport(cmd, asJSON, bench.PrintDepth)(bench.Depth(cmd.Context(), dcfg, progress))
			case "long":
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("--scale long starts worker processes of this binary: %w", err)
				}
				lcfg.Exe = exe
				return printReport(cmd, asJSON, bench.PrintLong)(bench.Long(cmd.Context(), lcfg, progress))
			case "coalesce":
				return printReport(cmd, asJSON, bench.PrintCoalesce)(bench.Coalesce(cmd.Context(), ccfg, progress))
			case "commit":
				ccfg := bench.CommitConfig{Serial: cfg.Serial, Throughput: cfg.Throughput, Concurrency: cfg.Concurrency, Quick: cfg.Quick, Deadline: deadline}
				return printReport(cmd, asJSON, bench.PrintCommit)(bench.Commit(cmd.Context(), ccfg, progress))
			default:
				return &exitErr{code: exitError, err: fmt.Errorf("--scale %q: the scale scenarios are: history, pending, depth, long, coalesce, commit", scale)}
			}
			printer := bench.Print
			if wide {
				printer = bench.PrintWide
			}
			return printReport(cmd, asJSON, printer)(bench.Run(cmd.Context(), cfg, progress))
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Serial, "serial", 0, "serial round trips per scenario (default 1000; 200 with --quick)")
	f.IntVar(&cfg.Throughput, "count", 0, "messages per throughput run (default 5000; 1000 with --quick)")
	f.IntVar(&cfg.Concurrency, "concurrency", 16, "concurrent handlers / worker slots")
	f.BoolVar(&cfg.Quick, "quick", false, "a short run (under 30 s)")
	f.StringVar(&cfg.WorkspaceRoot, "workspace-root", "", "make the workers' workspaces under this directory (default: a temporary directory), e.g. to compare a tmpfs")
	f.BoolVar(&cfg.NoExec, "no-exec", false, "leave out the rows that run processes (the fork/exec baseline, the exec rows, the sandbox's layers): the message path alone")
	f.BoolVar(&cfg.Breakdown, "breakdown", false, "print the per-stage timings of the traced row and of a traced resume (each span kind's p50 and p99)")
	f.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	f.BoolVar(&wide, "wide", false, "print each row's scenario in its line (about 190 columns) instead of numbered rows with a legend (100)")
	f.DurationVar(&deadline, "deadline", 0, "bound on the whole run or scale scenario (default: by its size, docs/performance.md); a dispatch that ends failed or cancelled stops it sooner, and either way the error names what was lost or not done")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	f.StringVar(&scale, "scale", "", "run a scale scenario instead: history (threads through ask → answer → finish, then the retention passes: live heap, HeapInuse, RSS, bucket keys and stream messages at start, peak and after; storage per thread) pending (questions left waiting: memory, idle CPU, list and answer latency at that size) depth (one thread of many rounds: status and thread-view latency as it grows) or long (many sleeping sub-agents running at once on separate worker processes: memory per run in the workers and in its own processes, heartbeats, server traffic, nothing left after the workers are killed) or coalesce (many threads ask the same question: one waiting question, then one answer resumes them all: fan-out time, router and inbox memory) or commit (the acceptance's accepted event and work message stored as two pipelined publishes to two streams, to one stream, and as one atomic batch; then with a worker's first fence: the pair pipelined and the fence read by direct get, against accepted acknowledged before the work naming its sequence; on one node R1 and on a three-node cluster R3 in this process)")
	f.IntVar(&pcfg.Questions, "questions", 10000, "--scale pending: questions left waiting")
	f.IntVar(&dcfg.Rounds, "rounds", 50, "--scale depth: rounds of the thread")
	f.IntVar(&lcfg.Running, "running", 1000, "--scale long: dispatches running at once")
	f.IntVar(&lcfg.Workers, "workers", 4, "--scale long: worker processes they are spread over")
	f.DurationVar(&lcfg.Window, "window", 30*time.Second, "--scale long: how long heartbeats and traffic are counted")
	f.StringVar(&idleProfile, "idle-cpuprofile", "", "--scale pending: write a CPU profile of the idle window (every question waiting) to this file")
	f.IntVar(&ccfg.Threads, "threads-waiting", 1000, "--scale coalesce: threads asking the same question")
	f.IntVar(&hcfg.Threads, "threads", 20000, "--scale history: threads to push through")
	f.DurationVar(&hcfg.Retention, "retention", 30*time.Second, "--scale history: the retention of finished work")
	f.StringVar(&hcfg.HeapProfiles, "heap-profiles", "", "--scale history: write a heap profile at each point (start, peak, after_retention, settled) to this directory, as <point>.pb.gz (go tool pprof -base start.pb.gz settled.pb.gz shows what stays)")
	f.DurationVar(&hcfg.Settle, "settle", 0, "--scale history: wait this much longer after the retention and measure again (the streams' duplicate windows last 10m)")
	return cmd
}

// printReport returns the printer of a benchmark's report: as one JSON
// object with --json, else as show writes it; a benchmark that failed
// prints nothing and returns its error.
func printReport[R any](cmd *cobra.Command, asJSON bool, show func(io.Writer, R)) func(R, error) error {
	return func(rep R, err error) error {
		if err != nil {
			return err
		}
		if asJSON {
			return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
		}
		show(cmd.OutOrStdout(), rep)
		return nil
	}
}
