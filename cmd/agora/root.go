package main

import (
	"errors"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/buildinfo"
)

// version, when set at build time with -ldflags "-X main.version=…",
// overrides the build's own (internal/buildinfo).
var version = ""

type exitCoder interface{ ExitCode() int }

func asExit(err error, ec *exitCoder) bool { return errors.As(err, ec) }

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "agora",
		Short:         "Agora: durable dispatch for AI sub-agents that stop and ask",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCmd(), newBenchCmd(), newDevCmd(), newDemoAgentCmd(), newChaosCmd(), newServiceCmd(), newNeedsInputCmd(), newProgressCmd())
	g := addGlobalFlags(root)
	root.AddCommand(newInboxCmd(g), newDispatchCmd(g), newEventsCmd(g), newQuestionsCmd(g), newAnswerCmd(g),
		newCancelCmd(g), newStatusCmd(g), newSubagentCmd(g), newMCPCmd(g), newArtifactsCmd(g), newDecisionsCmd(g), newAuditCmd(g))
	return root
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Long: `version prints the build's version (internal/buildinfo). With --json it
prints one object: version, release, revision (the VCS revision the build
records, when it does), go (the toolchain) and os_arch.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version
			if v == "" {
				v = buildinfo.Version()
			}
			if asJSON {
				return newJSONLines(cmd.OutOrStdout()).write(struct {
					Version  string `json:"version"`
					Release  string `json:"release"`
					Revision string `json:"revision,omitempty"`
					Go       string `json:"go"`
					OSArch   string `json:"os_arch"`
				}{v, buildinfo.Release, buildinfo.Revision(), runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH})
			}
			cmd.Println("agora " + v)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: version, release, revision, go, os_arch")
	return cmd
}
