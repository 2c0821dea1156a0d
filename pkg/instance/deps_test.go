package instance_test

import (
	"os/exec"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// TestLibraryCarriesNoSharder checks that a controller embedding the instance
// library does not link the sharder's controllers or metrics: those register
// metric families and pull in code an instance never runs.
func TestLibraryCarriesNoSharder(t *testing.T) {
	g := NewWithT(t)
	out, err := exec.Command("go", "list", "-deps", "github.com/sharder-dev/sharder/pkg/instance").CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(out))
	deps := strings.Fields(string(out))
	g.Expect(deps).To(ContainElement("github.com/sharder-dev/sharder/pkg/instance/lease"))
	for _, sharderOnly := range []string{"assign", "leases", "metrics", "webhook", "config"} {
		g.Expect(deps).NotTo(ContainElement("github.com/sharder-dev/sharder/pkg/"+sharderOnly), "pkg/instance depends on pkg/%s", sharderOnly)
	}
}
