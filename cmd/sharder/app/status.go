package app

import (
	"errors"

	"github.com/spf13/cobra"
)

// NewStatusCommand returns `sharder status`.
func NewStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show rings, instances, objects per instance and drains in flight",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("sharder status: not built yet")
		},
	}
}
