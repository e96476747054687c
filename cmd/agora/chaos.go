package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/harness/chaos"
)

func newChaosCmd() *cobra.Command {
	var cfg chaos.Config
	var short, asJSON bool
	cmd := &cobra.Command{
		Use:   "chaos [--short] [--soak DURATION] [--threads N] [--workers N] [--json]",
		Short: "Soak Agora under process kills and pauses, then audit the streams",
		Long: `chaos runs its own embedded JetStream, the dispatcher, the router, several
worker processes, the A2A door and the MCP HTTP server; dispatches threads whose
sub-agent sleeps, sometimes asks and sometimes leaves a daemon behind (one in
five through A2A, one in five through MCP Tasks, answered through the same
door); answers every question 1-3 times at once; meanwhile SIGKILLs and
restarts workers, the router, the dispatcher and the doors and pauses workers
past AckWait. Each door must report its threads completed with their output. Then it audits the lifecycle and question streams
and the dispatch records: one terminal event per dispatch, every thread ended,
no dispatch failed or cancelled (the soak causes neither), every question
answered once and resumed once, every finished output the one its attempt
wrote (never null), no record left unqueued, no sub-agent process left
behind. It counts the ends by kind and reason.
Threads share some of their questions, so some join one already asked (ask
once); the audit checks each group's asked question lists exactly the threads
that joined it and that each was resumed exactly once, and the router is
sometimes killed as it fans an answer out to them.
One run in ten works for --long-run (6s), longer than every housekeeping
interval of the soak's services, which are shortened (workspace sweep 1s,
reconciler 2s, router scan 500ms and cancel sweep 1s) so they cross live runs.
--soak DURATION keeps dispatching (a thread every --pace) and injecting faults
for that long, printing a line a minute, then settles and audits.
It exits 1 on any anomaly. --short is the CI form (about a minute).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if short {
				cfg.Threads, cfg.FaultEvery, cfg.FaultWindow, cfg.Deadline = max(cfg.Threads, 30), time.Second, 15*time.Second, 3*time.Minute
			}
			rep, err := chaos.Run(cmd.Context(), cfg, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				_ = enc.Encode(rep)
			} else {
				chaos.Print(cmd.OutOrStdout(), rep)
			}
			if !rep.OK() {
				return &exitErr{code: 1, err: fmt.Errorf("chaos: %d anomalies", len(rep.Anomalies))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&short, "short", false, "the short form CI runs (30 threads, a fault a second)")
	f.IntVar(&cfg.Threads, "threads", 0, "threads to dispatch (default 200)")
	f.IntVar(&cfg.Workers, "workers", 0, "worker processes (default 3)")
	f.DurationVar(&cfg.FaultEvery, "fault-every", 0, "time between faults (default 2s)")
	f.DurationVar(&cfg.FaultWindow, "fault-window", 0, "how long faults go on after the last dispatch (default 30s)")
	f.DurationVar(&cfg.Deadline, "deadline", 0, "bound on the whole run (default 10m, or the soak plus 10m)")
	f.DurationVar(&cfg.Soak, "soak", 0, "dispatch and inject faults for this long instead of --threads threads")
	f.DurationVar(&cfg.Pace, "pace", 0, "time between two dispatches (default 20ms; 250ms with --soak)")
	f.DurationVar(&cfg.LongRun, "long-run", 0, "how long one run in ten works (default 6s)")
	f.BoolVar(&asJSON, "json", false, "print the audit as JSON")
	return cmd
}
