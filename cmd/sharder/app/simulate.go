package app

import (
	"errors"

	"github.com/spf13/cobra"
)

// NewSimulateCommand returns `sharder simulate`.
func NewSimulateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "simulate",
		Short: "Simulate a ring offline: balance and movement on membership changes",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("sharder simulate: not built yet")
		},
	}
}
