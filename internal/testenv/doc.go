// Package testenv starts a real control plane (etcd and kube-apiserver, built
// from Go modules into bin/ by the Makefile) for tests, the demo and the e2e
// suite.
//
// Most tests need only Run in TestMain and Env.Namespace per test (Start and
// Env.Stop serve programs that are not tests):
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Run(m, &env, testenv.Options{})) }
//
//	func TestSomething(t *testing.T) {
//		ns := env.Namespace(t)
//		...
//	}
//
// A test that runs controllers starts its manager with the test-only
// options (no metrics or health endpoints, no controller name validation)
// and stops it when it ends:
//
//	opts := env.ManagerOptions()
//	opts.Cache = ... // what the test needs on top
//	mgr := env.NewManager(t, nil, opts)
//	// add controllers to mgr
//	stop := testenv.StartManager(t, mgr)
//
// The binaries are found through KUBEBUILDER_ASSETS, or else in the
// repository's bin/k8s/<version> folder that `make control-plane` fills.
// Nothing here fakes the API server.
package testenv
