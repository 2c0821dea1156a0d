package ringbuilds

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// TestBuildsLockPerRing checks that a build of one ring that takes long
// does not hold up the build of another ring, and that the same
// membership is not built twice.
func TestBuildsLockPerRing(t *testing.T) {
	g := NewWithT(t)
	entered, release := make(chan struct{}), make(chan struct{})
	ring.Register("blocking-test", ring.AlgorithmFunc(func(members []ring.Member) (ring.Ring, error) {
		close(entered)
		<-release
		return ring.New(ring.Rendezvous, members)
	}))
	members := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateReady}}
	var rings Builds
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

// TestBuildsTwoMemberships checks that two users of one Builds that see two
// memberships in turn (the webhook has observed a new Lease, the assignment
// not yet) get each ring built once, not once per turn, and that Built
// counts builds only.
func TestBuildsTwoMemberships(t *testing.T) {
	g := NewWithT(t)
	builds := 0
	rings := Builds{Built: func(name string) {
		g.Expect(name).To(Equal("r"))
		builds++
	}}
	before := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateReady}}
	after := []membership.Member{before[0], before[1], {ID: "c", State: membership.StateReady}}
	first := map[int]ring.Ring{}
	for turn := range 6 {
		members := [][]membership.Member{before, after}[turn%2]
		rg, rebuilt, err := rings.Build("r", ring.ConsistentHashDense, 10, members)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(rebuilt).To(Equal(turn < 2), "turn %d", turn)
		if turn < 2 {
			first[turn] = rg
		}
		g.Expect(rg).To(BeIdenticalTo(first[turn%2]), "turn %d", turn)
	}
	g.Expect(builds).To(Equal(2))
}

// TestBuildsDerive checks that a ring Builds derives from the one before
// (consistent-hash-dense) places keys as a ring built from nothing.
func TestBuildsDerive(t *testing.T) {
	g := NewWithT(t)
	var rings Builds
	var members []membership.Member
	for i := range 20 {
		members = append(members, membership.Member{ID: fmt.Sprintf("instance-%d", i), State: membership.StateReady})
	}
	for _, ms := range [][]membership.Member{members, members[1:], append(members[1:], membership.Member{ID: "new", State: membership.StateReady, VirtualNodes: 100})} {
		derived, _, err := rings.Build("r", ring.ConsistentHashDense, 512, ms)
		g.Expect(err).NotTo(HaveOccurred())
		ready, _ := ReadyMembers(ring.ConsistentHashDense, 512, ms)
		built, err := ring.New(ring.ConsistentHashDense, ready)
		g.Expect(err).NotTo(HaveOccurred())
		for k := range 2000 {
			key := fmt.Sprintf("key-%d", k)
			want, _ := built.Lookup(key)
			g.Expect(derived.Lookup(key)).To(Equal(want), key)
		}
	}
}
