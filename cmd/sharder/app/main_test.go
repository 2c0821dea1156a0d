package app

import (
	"os"
	"testing"

	"github.com/sharder-dev/sharder/internal/testenv"
)

// env is the local control plane shared by the tests of this package.
var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, &env, testenv.Options{
		CRDDirectoryPaths: []string{"config/crd/bases"},
		Scheme:            newScheme(),
	}))
}
