package instance_test

import (
	"os/exec"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// TestLibraryCarriesNoSharder checks that a controller embedding the instance
// library does not link the sharder's controllers or metrics, nor the ring
// algorithms: those register metric families and pull in code an instance
// never runs (an instance never builds a ring).
func TestLibraryCarriesNoSharder(t *testing.T) {
	g := NewWithT(t)
	out, err := exec.Command("go", "list", "-deps", "github.com/sharder-dev/sharder/pkg/instance").CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(out))
	deps := strings.Fields(string(out))
	g.Expect(deps).To(ContainElement("github.com/sharder-dev/sharder/pkg/instance/leaseholder"))
	for _, dep := range deps {
		g.Expect(dep).NotTo(HavePrefix("github.com/sharder-dev/sharder/pkg/sharder/"), "pkg/instance depends on the sharder's side")
		g.Expect(dep).NotTo(HavePrefix("github.com/sharder-dev/sharder/pkg/ring"), "pkg/instance links the ring algorithms")
		g.Expect(dep).NotTo(Equal("github.com/buraksezer/consistent"), "pkg/instance links the ring algorithms")
	}
}
