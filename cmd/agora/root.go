package main

import (
	"errors"

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
		newCancelCmd(g), newStatusCmd(g), newSubagentCmd(g), newMCPCmd(g), newArtifactsCmd(g), newDecisionsCmd(g))
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version
			if v == "" {
				v = buildinfo.Version()
			}
			cmd.Println("agora " + v)
			return nil
		},
	}
}
