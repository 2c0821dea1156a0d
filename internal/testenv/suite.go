package testenv

import (
	"fmt"
	"sync"
)

// Suite is a test package's control plane, started by the first test that
// asks for it: a package's pure tests, run alone (go test -run), start no
// etcd and no kube-apiserver. A package declares one and runs its tests
// with Run:
//
//	var suite testenv.Suite
//
//	func TestMain(m *testing.M) {
//		os.Exit(testenv.Run(m, &suite, testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}}))
//	}
//
//	// env returns the control plane, starting it on first use.
//	func env() *testenv.Env { return suite.Env() }
type Suite struct {
	opts Options

	once sync.Once
	env  *Env
	err  error
}

// Env returns the running control plane, starting it on the first call. A
// control plane that cannot start panics the calling test with the reason:
// no test that needs it can run, and the message says what to do (for
// example run `make control-plane`).
func (s *Suite) Env() *Env {
	s.once.Do(func() { s.env, s.err = Start(s.opts) })
	if s.err != nil {
		panic(fmt.Sprintf("testenv: %v", s.err))
	}
	return s.env
}
