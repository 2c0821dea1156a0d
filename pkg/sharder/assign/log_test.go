package assign_test

import (
	"os"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// testLogger discards logs unless SHARDER_TEST_LOG is set.
func testLogger() logr.Logger {
	if os.Getenv("SHARDER_TEST_LOG") != "" {
		return zap.New(zap.UseDevMode(true))
	}
	return logr.Discard()
}
