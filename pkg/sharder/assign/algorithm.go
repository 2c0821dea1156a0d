package assign

import (
	"fmt"
	"strings"

	"github.com/sharder-dev/sharder/pkg/ring"
)

// unknownAlgorithm returns why a ring naming algorithm cannot run in this
// sharder, or "" when the sharder knows the algorithm. Algorithms are
// registered when the sharder is built (ring.Register before the command
// runs), so the answer does not change while it runs; a ring naming an
// unknown algorithm is left alone, its objects keep their labels, until its
// spec changes.
func unknownAlgorithm(algorithm string) string {
	if ring.Registered(algorithm) {
		return ""
	}
	return fmt.Sprintf("The ring's algorithm %q is not registered in this sharder, which knows %s. "+
		"Run a sharder built with %q registered (ring.Register), or choose an algorithm it knows; "+
		"nothing of the ring is assigned or moved until then.",
		algorithm, strings.Join(ring.Algorithms(), ", "), algorithm)
}
