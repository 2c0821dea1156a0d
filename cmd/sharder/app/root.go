package app

import (
	"github.com/spf13/cobra"
)

// NewRootCommand returns the sharder command with all its subcommands.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "sharder",
		Short: "Shard Kubernetes controllers: run N instances, each reconciling its share of the objects",
		Long: `sharder assigns the objects of a controller to its instances with consistent
hashing, writes the assignment into a shard label on every object, moves objects
safely when instances come and go, and protects those labels with a webhook.`,
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.AddCommand(
		NewRunCommand(),
		NewAgentCommand(),
		NewStatusCommand(),
		NewProbeCommand(),
		NewUninstallCommand(),
		NewSimulateCommand(),
		NewVersionCommand(),
	)
	return root
}
