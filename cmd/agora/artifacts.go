package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

func newArtifactsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "artifacts list THREAD|DISPATCH | get THREAD|DISPATCH NAME [-o FILE]",
		Short: "List and download the files sub-agents left",
		Long: `A sub-agent's files under .agora/artifacts/ are kept after its run (uploaded
to the object store agora_artifacts for as long as the lifecycle history,
7 days by default) and listed in its dispatch's terminal event.

  agora artifacts list ID          every artifact of a thread's rounds (or of one dispatch)
  agora artifacts get ID NAME [-o FILE]
                                   stream one to stdout or FILE, checking its sha256`,
	}
	cmd.AddCommand(newArtifactsListCmd(g), newArtifactsGetCmd(g))
	return cmd
}

// artifactLine is one line of `agora artifacts list --json`.
type artifactLine struct {
	DispatchID string `json:"dispatch_id"`
	Round      int    `json:"round"`
	lifecycle.Artifact
	Skipped string `json:"skipped,omitempty"`
}

func newArtifactsListCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list THREAD|DISPATCH [--json]",
		Short: "List a thread's (or a dispatch's) artifacts",
		Args:  args(0, arg{"ID", "a thread or dispatch id", "agora artifacts list 01JZ8W3K2Q…"}),
		RunE: func(cmd *cobra.Command, a []string) error {
			id := a[0]
			c, err := g.connectTo(id, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			type round struct {
				id    string
				round int
			}
			var rounds []round
			if th, err := c.Thread(ctx, id); err == nil {
				for _, r := range th.Rounds {
					rounds = append(rounds, round{r.DispatchID, r.Round})
				}
			} else if rec, err := c.Status(ctx, id); err == nil {
				rounds = append(rounds, round{rec.DispatchID, rec.Round})
			} else if isNotFound(err) {
				return errNotFound("thread or dispatch", id, "`agora events` lists recent ones")
			} else {
				return g.explain(err, lifecycle.APIStatus)
			}
			var lines []artifactLine
			running := 0
			for _, r := range rounds {
				outs, err := c.Artifacts(ctx, r.id)
				if errors.Is(err, client.ErrNotEnded) {
					running++
					continue
				}
				if err != nil {
					return g.explain(err, lifecycle.APIStatus)
				}
				for _, a := range outs.Artifacts {
					lines = append(lines, artifactLine{DispatchID: r.id, Round: r.round, Artifact: a})
				}
				for _, s := range outs.ArtifactsSkipped {
					lines = append(lines, artifactLine{DispatchID: r.id, Round: r.round, Artifact: lifecycle.Artifact{Name: s.Name}, Skipped: s.Reason})
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				jl := newJSONLines(out)
				for _, l := range lines {
					var v any = l
					if l.Skipped != "" {
						v = map[string]any{"dispatch_id": l.DispatchID, "round": l.Round, "name": l.Name, "skipped": l.Skipped}
					}
					if err := jl.write(v); err != nil {
						return err
					}
				}
				return nil
			}
			if len(lines) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no artifacts (a sub-agent keeps files by writing them under $AGORA_ARTIFACTS_DIR)")
			} else {
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ROUND\tDISPATCH\tNAME\tSIZE\tTYPE\tSHA256")
				for _, l := range lines {
					if l.Skipped != "" {
						fmt.Fprintf(tw, "%d\t%s\t%s\t-\tskipped: %s\t-\n", l.Round, l.DispatchID, l.Name, l.Skipped)
						continue
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", l.Round, l.DispatchID, l.Name, l.Size, l.ContentType, l.SHA256[:12])
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "\ndownload one: %s artifacts get DISPATCH NAME -o FILE\n", g.cli(cmd))
			}
			if running > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%d round(s) still running: their artifacts are listed when they end\n", running)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only: one object per artifact")
	return cmd
}

func newArtifactsGetCmd(g *globals) *cobra.Command {
	var outFile string
	cmd := &cobra.Command{
		Use:   "get THREAD|DISPATCH NAME [-o FILE]",
		Short: "Download one artifact, checking its sha256",
		Long: `get downloads the artifact NAME left by a dispatch, checking its sha256. Given
a thread id it takes the artifact from the latest round that left one of that
name.`,
		Args: args(0, arg{"ID", "a thread id, or the dispatch that left the artifact", "agora artifacts get 01JZ8W3K2Q… patches/fix.diff -o fix.diff"},
			arg{"NAME", "the artifact's name as `agora artifacts list` shows it", "agora artifacts get 01JZ8W3K2Q… patches/fix.diff -o fix.diff"}),
		RunE: func(cmd *cobra.Command, a []string) error {
			id, name := a[0], a[1]
			if err := lifecycle.ValidToken(id); err != nil {
				return fmt.Errorf("%q is not a thread or dispatch id", id)
			}
			c, err := g.connect(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer c.Close()
			// A thread id stands for the latest of its rounds that left
			// the artifact, as `artifacts list` takes a thread id.
			if did, ok := threadArtifactDispatch(cmd.Context(), c, id, name); ok {
				id = did
			}
			r, art, err := c.OpenArtifact(cmd.Context(), id, name)
			switch {
			case errors.Is(err, client.ErrArtifactExpired):
				return fmt.Errorf("%s of dispatch %s has expired: artifacts are kept as long as the lifecycle history (7 days by default)", name, id)
			case errors.Is(err, client.ErrNotEnded):
				return fmt.Errorf("dispatch %s has not ended: its artifacts are listed when it does (%s status %s)", id, g.cli(cmd), id)
			case isNotFound(err):
				return fmt.Errorf("dispatch %s has no artifact %q — `%s artifacts list %s` lists them", id, name, g.cli(cmd), id)
			case err != nil:
				return g.explain(err, lifecycle.APIStatus)
			}
			defer r.Close()
			if outFile == "" || outFile == "-" {
				_, err := io.Copy(cmd.OutOrStdout(), r)
				return err
			}
			// Written beside the target and renamed once verified, so a
			// corrupt or interrupted download leaves no file behind.
			tmp, err := os.CreateTemp(filepath.Dir(outFile), "."+filepath.Base(outFile)+".part-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			n, err := io.Copy(tmp, r)
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("download %s: %w", name, err)
			}
			if err := os.Rename(tmp.Name(), outFile); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%d bytes, %s, sha256 %s verified)\n", outFile, n, art.ContentType, art.SHA256)
			return nil
		},
	}
	cmd.Flags().StringVarP(&outFile, "output", "o", "", "write to FILE instead of stdout")
	return cmd
}

// threadArtifactDispatch finds, when id is a thread, the latest of its
// ended rounds that left an artifact called name.
func threadArtifactDispatch(ctx context.Context, c *client.Client, id, name string) (string, bool) {
	th, err := c.Thread(ctx, id)
	if err != nil {
		return "", false
	}
	for i := len(th.Rounds) - 1; i >= 0; i-- {
		outs, err := c.Artifacts(ctx, th.Rounds[i].DispatchID)
		if err != nil {
			continue
		}
		for _, a := range outs.Artifacts {
			if a.Name == name {
				return th.Rounds[i].DispatchID, true
			}
		}
	}
	return "", false
}
