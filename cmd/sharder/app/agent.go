package app

import (
	"errors"

	"github.com/spf13/cobra"
)

// NewAgentCommand returns `sharder agent`.
func NewAgentCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "agent",
		Short: "Hold an instance Lease for a controller that cannot be changed (sidecar)",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("sharder agent: not built yet")
		},
	}
}
