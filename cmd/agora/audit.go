package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/auditlog"
)

func newAuditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit export [--since T] [--route R] [--thread T] [--format jsonl] | verify FILE [--public-key FILE]",
		Short: "Export and verify the tamper-evident decision log",
		Long: `Agora keeps a decision log (the AGORA_AUDIT stream, docs/audit.md): one
hash-chained entry per question asked, escalated, answered, expired or
withdrawn and per cancel, with signed checkpoints when the writer has a key.

  agora audit export > log.jsonl             the whole log
  agora audit export --thread T > t.jsonl    one thread's trail (and every checkpoint)
  agora audit verify log.jsonl [--public-key audit.pub]

verify needs no NATS: it checks a file, as examples/audit/verify.py does in
another language.`,
	}
	cmd.AddCommand(newAuditExportCmd(g), newAuditVerifyCmd())
	return cmd
}

func newAuditExportCmd(g *globals) *cobra.Command {
	var (
		since, route, thread, format, output string
	)
	cmd := &cobra.Command{
		Use:   "export [--since T] [--route R] [--thread T] [--format jsonl] [-o FILE]",
		Short: "Write the decision log as JSON lines",
		Long: `export writes a header line ({"agora_audit_export":1,"complete":…,"filter":…}),
then every entry selected, byte for byte as stored, up to the entry that was
last when it started. Without filters the export is complete and proves the
whole chain from seq 1. --route and --thread select entries (checkpoints and
gaps are always kept); --since (an RFC 3339 time or a duration such as 24h)
starts at entries appended since then. A filtered export proves each entry
unaltered against its own hash, and the links wherever its entries are
consecutive; it does not prove that nothing between them was left out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "jsonl" {
				return fmt.Errorf("--format %q: only jsonl is supported", format)
			}
			f := auditlog.Filter{Route: route, Thread: thread}
			for flag, v := range map[string]string{"--route": route, "--thread": thread} {
				if v != "" && lifecycle.ValidToken(v) != nil {
					return fmt.Errorf("%s %q is not a valid name", flag, v)
				}
			}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return err
				}
				f.Since = t
			}
			c, err := g.connect(safeErr(cmd))
			if err != nil {
				return err
			}
			defer c.Close()
			js, err := jetstream.New(c.Conn())
			if err != nil {
				return err
			}
			var out io.Writer = cmd.OutOrStdout() // exact bytes: the hashes cover them
			if output != "" {
				file, err := os.Create(output)
				if err != nil {
					return err
				}
				defer file.Close()
				out = file
			}
			n, err := auditlog.Export(cmd.Context(), js, f, out)
			if err != nil {
				return g.explain(err, "$JS.API.CONSUMER.CREATE."+audit.Stream)
			}
			if output != "" {
				fmt.Fprintf(safeErr(cmd), "%d entries written to %s\n", n, output)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "entries appended since this time (RFC 3339) or this long ago (e.g. 24h)")
	cmd.Flags().StringVar(&route, "route", "", "only entries of this route")
	cmd.Flags().StringVar(&thread, "thread", "", "only entries of this thread")
	cmd.Flags().StringVar(&format, "format", "jsonl", "output format: jsonl")
	cmd.Flags().StringVarP(&output, "output", "o", "", "write to this file instead of stdout")
	return cmd
}

func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration (24h)", s)
}

func newAuditVerifyCmd() *cobra.Command {
	var publicKey string
	var requireSigned bool
	cmd := &cobra.Command{
		Use:   "verify FILE [--public-key FILE] [--require-signed]",
		Short: "Check every hash, link and signature of an export",
		Long: `verify checks an export of the decision log: every entry's hash against its
content; in a complete export, that seq runs from 1 without a hole and each
prev_hash is the hash of the entry before; in a filtered one, the links
where its entries are consecutive; every checkpoint's head hash and count,
and with --public-key (a PEM Ed25519 public key) its signature. It names
the first entry that was altered, removed, inserted or reordered, and exits
1; 0 when the export holds.`,
		Args: args(0, arg{"FILE", "an export written by agora audit export", "agora audit verify log.jsonl"}),
		RunE: func(cmd *cobra.Command, a []string) error {
			var opts audit.VerifyOptions
			if publicKey != "" {
				k, err := audit.ReadPublicKey(publicKey)
				if err != nil {
					return err
				}
				opts.PublicKey, opts.RequireSigned = k, requireSigned
			}
			f, err := os.Open(a[0])
			if err != nil {
				return err
			}
			defer f.Close()
			rep, err := audit.Verify(f, opts)
			if err != nil {
				return &exitErr{code: 1, err: err}
			}
			printAuditReport(safeOut(cmd), rep, opts.PublicKey != nil)
			return nil
		},
	}
	cmd.Flags().StringVar(&publicKey, "public-key", "", "PEM file of the Ed25519 public key that signs checkpoints")
	cmd.Flags().BoolVar(&requireSigned, "require-signed", false, "with --public-key, an unsigned checkpoint is an error")
	return cmd
}

func printAuditReport(w io.Writer, rep audit.Report, keyed bool) {
	what := "complete export: the whole chain from seq 1 holds"
	if !rep.Complete {
		what = "filtered export (" + rep.Filter + "): every entry matches its hash and consecutive entries link; it does not show what was left out"
	}
	fmt.Fprintf(w, "ok: %s\n", what)
	fmt.Fprintf(w, "entries %d (seq %d to %d), checkpoints %d, head %s\n", rep.Entries, rep.FirstSeq, rep.LastSeq, rep.Checkpoints, rep.HeadHash)
	switch {
	case !keyed:
		fmt.Fprintln(w, "signatures not checked (no --public-key)")
	case rep.Signed == 0:
		fmt.Fprintln(w, "no signed checkpoint: the chain alone vouches for the entries")
	default:
		fmt.Fprintf(w, "signed checkpoints %d verified; the last at seq %d (entries after it are vouched for by the chain alone)\n", rep.Signed, rep.LastSigned)
	}
}
