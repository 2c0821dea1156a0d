package app

import (
	"errors"

	"github.com/spf13/cobra"
)

// NewRunCommand returns `sharder run`.
func NewRunCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Run the sharder (leader-elected assignment, lease controller and webhook)",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("sharder run: not built yet")
		},
	}
}
