// Command sharder is the sharder with one more ring algorithm, by-namespace,
// which keeps every object of a namespace on the same instance. It is the
// sharder's own command (app.NewRootCommand) plus one ring.Register call:
// build and deploy it instead of the stock image, and ControllerRings may
// say spec.algorithm: by-namespace.
package main

import (
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/sharder-dev/sharder/cmd/sharder/app"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// Algorithm is the name rings give in spec.algorithm. The ControllerRing
// API admits lowercase letters, digits, '-' and '.', at most 63 characters.
const Algorithm = "by-namespace"

// Registered in init, before any command runs: the sharder builds rings
// from the registry as soon as it starts, and so does `sharder simulate`.
func init() {
	ring.Register(Algorithm, ring.AlgorithmFunc(buildByNamespace))
}

func main() {
	if err := app.NewRootCommand().ExecuteContext(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}

// buildByNamespace places namespaces, not objects, on a weighted rendezvous
// ring of the members. It gets the members sorted, deduplicated and with
// weights clamped, and must be deterministic for them: every sharder replica
// and the webhook build the same ring. So is the built-in it delegates to.
func buildByNamespace(members []ring.Member) (ring.Ring, error) {
	r, err := ring.New(ring.Rendezvous, members)
	if err != nil {
		return nil, err
	}
	return byNamespace{r}, nil
}

// byNamespace looks up the namespace of a key; Members comes from the
// rendezvous ring. It is read-only once built, hence safe for concurrent use.
type byNamespace struct{ ring.Ring }

// Lookup returns the instance of the key's namespace. Keys are
// "<group>/<Kind>/<namespace>/<name>" (ring.ObjectKey); group, kind and
// namespace never contain '/'. Cluster-scoped objects (empty namespace)
// all land on one instance.
func (r byNamespace) Lookup(key string) (string, error) {
	parts := strings.SplitN(key, "/", 4)
	if len(parts) < 4 {
		return r.Ring.Lookup(key)
	}
	return r.Ring.Lookup(parts[2])
}
