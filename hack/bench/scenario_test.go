package main

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// flags are the defaults of main's flags that the scenarios' configure reads.
func flags() params {
	return params{objects: 10000, instances: 1000, leaseDuration: defaultLeaseDuration, profileDuration: 10 * time.Second,
		watchedObjects: 100000, admittedObjects: 20000, slotCount: 256}
}

// TestChooseScenario checks that the mode flags choose their scenario, with
// its defaults for the flags left unset, and that the default scenario runs
// without one.
func TestChooseScenario(t *testing.T) {
	g := NewWithT(t)
	none := func(string) bool { return false }

	p := flags()
	s, err := chooseScenario(&p, none)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.mode).To(BeEmpty())
	g.Expect(p).To(Equal(flags()), "the default scenario keeps the flags")

	p = flags()
	p.scale = true
	s, err = chooseScenario(&p, none)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.mode).To(Equal("scale"))
	g.Expect(p.leaseDuration).To(Equal(15 * time.Second))
	g.Expect(p.instances).To(Equal(1000))

	p = flags()
	p.scale, p.leaseDuration = true, 4*time.Second
	_, err = chooseScenario(&p, func(name string) bool { return name == "lease-duration" })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.leaseDuration).To(Equal(4*time.Second), "a --lease-duration set is kept")

	p = flags()
	p.manyObjects, p.objects = true, 1000000
	s, err = chooseScenario(&p, none)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.mode).To(Equal("many-objects"))
	g.Expect(p.instances).To(Equal(10))
	g.Expect(p.profileDuration).To(Equal(20 * time.Second))
	g.Expect(p.leaseDuration).To(Equal(15 * time.Second))

	p = flags()
	p.slots = true
	s, err = chooseScenario(&p, none)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.mode).To(Equal("slots"))
	g.Expect(p.instances).To(Equal(3))
	g.Expect(p.leaseDuration).To(Equal(15 * time.Second))
}

// TestChooseScenarioRefuses checks the usage errors: flags a scenario cannot
// run with, and more than one mode.
func TestChooseScenarioRefuses(t *testing.T) {
	g := NewWithT(t)
	set := func(names ...string) func(string) bool {
		return func(name string) bool {
			for _, n := range names {
				if n == name {
					return true
				}
			}
			return false
		}
	}
	for name, c := range map[string]struct {
		p    func(*params)
		set  func(string) bool
		want string
	}{
		"scale, 2 instances": {func(p *params) { p.scale, p.instances = true, 2 }, set("instances"), "--scale needs"},
		"scale, 3.5s leases": {func(p *params) { p.scale, p.leaseDuration = true, 3500*time.Millisecond }, set("lease-duration"), "--scale needs"},
		"many objects, few":  {func(p *params) { p.manyObjects = true }, set(), "--many-objects needs"},
		"slots, 1 instance":  {func(p *params) { p.slots, p.instances = true, 1 }, set("instances"), "--slots needs"},
		"slots, few slots":   {func(p *params) { p.slots, p.slotCount = true, 3 }, set("slot-count"), "--slots needs"},
		"two modes":          {func(p *params) { p.scale, p.slots = true, true }, set(), "--scale, --slots: one mode at a time"},
	} {
		p := flags()
		c.p(&p)
		_, err := chooseScenario(&p, c.set)
		g.Expect(err).To(MatchError(ContainSubstring(c.want)), name)
	}
}

// TestScenarios checks the table: every scenario can be run, in its own
// folder, and the steps of the modes whose set-up starts nothing are those
// they report on, in order.
func TestScenarios(t *testing.T) {
	g := NewWithT(t)
	folders := map[string]bool{}
	for _, s := range scenarios {
		g.Expect(s.chosen).NotTo(BeNil(), s.mode)
		g.Expect(s.setUp).NotTo(BeNil(), s.mode)
		g.Expect(s.announce).NotTo(BeNil(), s.mode)
		g.Expect(s.write).NotTo(BeNil(), s.mode)
		g.Expect(folders).NotTo(HaveKey(s.folder), s.mode)
		folders[s.folder] = true
	}
	g.Expect(scenarios[len(scenarios)-1].mode).To(BeEmpty(), "the default scenario comes last: it is chosen when no mode is")

	names := func(mode string) []string {
		for _, s := range scenarios {
			if s.mode == mode {
				r, err := s.setUp(context.Background(), &bench{p: flags()})
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(r.report).NotTo(BeNil())
				var names []string
				for _, st := range r.steps {
					names = append(names, st.name)
				}
				if r.release != nil {
					r.release()
				}
				return names
			}
		}
		t.Fatalf("no scenario %q", mode)
		return nil
	}
	g.Expect(names("scale")).To(Equal([]string{"set-up", "initial assignment", "steady renewals", "instance added", "instance stopped", "instance killed"}))
	g.Expect(names("many-objects")).To(Equal([]string{"set-up", "first start", "creation in admission mode", "restart", "API server", "scale-out"}))

	var def scenario
	for _, s := range scenarios {
		if s.mode == "" {
			def = s
		}
	}
	p := flags()
	g.Expect(def.skip(p, "rebalance")).To(BeFalse(), "without --step, every step runs")
	p.steps = []string{"rebalance"}
	g.Expect(def.skip(p, "rebalance")).To(BeFalse())
	g.Expect(def.skip(p, "memory")).To(BeTrue())
	g.Expect(def.skip(p, "initial assignment")).To(BeFalse(), "the initial assignment always runs")
}
