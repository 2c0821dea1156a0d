// Command sharder runs the sharder and its tools. See `sharder --help`.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/sharder-dev/sharder/cmd/sharder/app"
)

func main() {
	if err := app.NewRootCommand().ExecuteContext(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
