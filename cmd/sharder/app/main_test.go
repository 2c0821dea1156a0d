package app

import (
	"os"

	"testing"

	"github.com/go-logr/logr"

	"github.com/sharder-dev/sharder/internal/testenv"
)

// env is the local control plane shared by the tests of this package.
var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	// The process's loggers are set before anything logs, as the sharder's
	// main does by running one command; the commands that the tests run
	// later log through their own loggers.
	setProcessLoggers(logr.Discard())
	os.Exit(testenv.Run(m, &suite, testenv.Options{
		CRDDirectoryPaths: []string{"config/crd/bases"},
		Scheme:            newScheme(),
	}))
}
