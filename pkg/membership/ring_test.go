package membership

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/sharder-dev/sharder/pkg/ring"
)

// TestRingsLockPerRing checks that a build of one ring that takes long
// does not hold up the build of another ring, and that the same
// membership is not built twice.
func TestRingsLockPerRing(t *testing.T) {
	g := NewWithT(t)
	entered, release := make(chan struct{}), make(chan struct{})
	ring.Register("blocking-test", ring.AlgorithmFunc(func(members []ring.Member) (ring.Ring, error) {
		close(entered)
		<-release
		return ring.New(ring.Rendezvous, members)
	}))
	members := []Member{{ID: "a", State: StateReady}, {ID: "b", State: StateReady}}
	var rings Rings
	slow := make(chan error, 1)
	go func() {
		_, _, err := rings.Build("slow", "blocking-test", 10, members)
		slow <- err
	}()
	<-entered

	fast := make(chan error, 1)
	go func() {
		_, rebuilt, err := rings.Build("fast", ring.Rendezvous, 10, members)
		if err == nil && !rebuilt {
			t.Error("the first build of a ring was not a build")
		}
		fast <- err
	}()
	select {
	case err := <-fast:
		g.Expect(err).NotTo(HaveOccurred())
	case <-time.After(10 * time.Second):
		t.Fatal("the build of one ring waited for the build of another")
	}
	close(release)
	g.Expect(<-slow).To(Succeed())

	_, rebuilt, err := rings.Build("fast", ring.Rendezvous, 10, members)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rebuilt).To(BeFalse())
	rings.Forget("fast")
	_, rebuilt, err = rings.Build("fast", ring.Rendezvous, 10, members)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rebuilt).To(BeTrue())
}
