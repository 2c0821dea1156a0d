package testenv

import (
	"context"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// managerStopTimeout bounds how long stopping a test manager may take.
const managerStopTimeout = 2 * time.Minute

// slowStopReport is how long a stopping manager may take before the test
// logs every goroutine's stack: a manager that does not stop is a defect to
// find, and its stacks say where it waits.
const slowStopReport = 20 * time.Second

// ManagerOptions returns the options of a manager in a test: the Env's
// scheme, no metrics or health endpoints, and no controller name validation
// (one test process starts many managers that register the same
// controllers). Set more fields on the result (the cache, a logger) before
// NewManager.
func (e *Env) ManagerOptions() manager.Options {
	return manager.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}
}

// NewManager creates a manager with opts (usually from ManagerOptions) on
// cfg, the Env's admin config when nil. It fails the test when it cannot.
func (e *Env) NewManager(t testing.TB, cfg *rest.Config, opts manager.Options) manager.Manager {
	t.Helper()
	if cfg == nil {
		cfg = e.Config
	}
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		t.Fatalf("creating manager: %v", err)
	}
	return mgr
}

// StartManager runs mgr until the test ends. The returned function stops it
// earlier; it waits for the manager to return (at most 2 minutes) and fails the
// test on an error. Calling it again does nothing.
func StartManager(t testing.TB, mgr manager.Manager) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			slow := time.AfterFunc(slowStopReport, func() {
				var stacks strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
				t.Logf("manager still stopping after %s; goroutines:\n%s", slowStopReport, stacks.String())
			})
			defer slow.Stop()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("manager: %v", err)
				}
			case <-time.After(managerStopTimeout):
				t.Errorf("manager did not stop within %s", managerStopTimeout)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
