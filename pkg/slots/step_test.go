package slots

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/sharder-dev/sharder/pkg/membership"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const timeout = 30 * time.Second

func TestDecide(t *testing.T) {
	ready := Instance{State: membership.StateReady, Weight: 1}
	acked := func(i Instance, rev int64) Instance { i.Acknowledged = rev; return i }
	state := func(s membership.State, movable bool) Instance {
		return Instance{State: s, Weight: 1, Movable: movable}
	}
	granted := Slot{Holder: "a"}
	releasing := Slot{Holder: "a", Releasing: true, Since: 5}
	for name, tc := range map[string]struct {
		s    situation
		want decision
	}{
		"unassigned, nobody ready":        {situation{target: ""}, decision{action: Hold}},
		"unassigned":                      {situation{target: "b"}, decision{action: Grant}},
		"granted where it belongs":        {situation{slot: granted, target: "a", known: true, holder: ready}, decision{action: Keep}},
		"granted elsewhere":               {situation{slot: granted, target: "b", known: true, holder: ready}, decision{action: Release}},
		"releasing, not acknowledged":     {situation{slot: releasing, target: "b", known: true, holder: acked(ready, 4), releaseSeen: t0, drainTimeout: timeout, now: t0.Add(timeout - 1)}, decision{action: Wait, at: t0.Add(timeout)}},
		"releasing, past the deadline":    {situation{slot: releasing, target: "b", known: true, holder: acked(ready, 4), releaseSeen: t0, drainTimeout: timeout, now: t0.Add(timeout)}, decision{action: Fence}},
		"releasing, acknowledged":         {situation{slot: releasing, target: "b", known: true, holder: acked(ready, 5), releaseSeen: t0, drainTimeout: timeout, now: t0.Add(timeout)}, decision{action: GrantAcknowledged}},
		"acknowledged, then expired":      {situation{slot: releasing, target: "b", known: true, holder: acked(state(membership.StateExpired, false), 7)}, decision{action: GrantAcknowledged}},
		"acknowledged, nobody ready":      {situation{slot: releasing, target: "", known: true, holder: acked(state(membership.StateDead, false), 7)}, decision{action: Hold}},
		"acknowledged, belongs back":      {situation{slot: releasing, target: "a", known: true, holder: acked(ready, 5)}, decision{action: Withdraw}},
		"releasing, belongs back":         {situation{slot: releasing, target: "a", known: true, holder: ready}, decision{action: Withdraw}},
		"expired holder":                  {situation{slot: granted, target: "b", known: true, holder: state(membership.StateExpired, false)}, decision{action: Hold}},
		"expired holder, releasing":       {situation{slot: releasing, target: "b", known: true, holder: state(membership.StateExpired, false), releaseSeen: t0, drainTimeout: timeout, now: t0.Add(time.Hour)}, decision{action: Hold}},
		"restarting holder":               {situation{slot: granted, target: "b", known: true, holder: state(membership.StateRestarting, false)}, decision{action: Hold}},
		"uncertain holder":                {situation{slot: granted, target: "b", known: true, holder: state(membership.StateUncertain, false)}, decision{action: Hold}},
		"vanished holder":                 {situation{slot: granted, target: "b", known: true, holder: state(membership.StateVanished, true)}, decision{action: Hold}},
		"invalid holder":                  {situation{slot: granted, target: "b", known: true, holder: state(membership.StateInvalid, false)}, decision{action: Hold}},
		"unknown holder":                  {situation{slot: granted, target: "b"}, decision{action: Hold}},
		"dead holder, not held":           {situation{slot: granted, target: "b", known: true, holder: state(membership.StateDead, false)}, decision{action: Hold}},
		"dead holder, held":               {situation{slot: granted, target: "b", known: true, holder: state(membership.StateDead, true)}, decision{action: GrantGone}},
		"dead holder, releasing":          {situation{slot: releasing, target: "b", known: true, holder: state(membership.StateDead, true)}, decision{action: GrantGone}},
		"orphaned holder, held":           {situation{slot: granted, target: "b", known: true, holder: state(membership.StateOrphaned, true)}, decision{action: GrantGone}},
		"dead holder, held, nobody ready": {situation{slot: granted, target: "", known: true, holder: state(membership.StateDead, true)}, decision{action: Hold}},
	} {
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Expect(decide(tc.s)).To(Equal(tc.want))
		})
	}
}

// ready returns n ready instances of weight 1, i-0 to i-(n-1), with their
// acknowledgements.
func readyInstances(n int, acknowledged int64) map[string]Instance {
	out := map[string]Instance{}
	for i := range n {
		out["i-"+strconv.Itoa(i)] = Instance{State: membership.StateReady, Weight: 1, Acknowledged: acknowledged}
	}
	return out
}

// TestStepScaleOut: 3 → 4 instances over 256 slots. The first step grants
// every slot; adding an instance releases the slots it should get (one
// write) and grants none of them before their holders acknowledge; the
// acknowledgements grant them (one more write); then nothing changes.
func TestStepScaleOut(t *testing.T) {
	g := NewWithT(t)
	in := Input{Instances: readyInstances(3, 0), ReleasesSeen: map[int64]time.Time{}, DrainTimeout: timeout, Now: t0}
	r := Step(NewTable(256), in)
	g.Expect(r.Changed).To(BeTrue())
	g.Expect(r.Table.Revision).To(Equal(int64(1)))
	g.Expect(countBy(r.Table.Holders())).To(Equal(map[string]int{"i-0": 86, "i-1": 85, "i-2": 85}))
	g.Expect(Step(r.Table, in).Changed).To(BeFalse())

	in.Instances = readyInstances(4, 0)
	released := Step(r.Table, in)
	g.Expect(released.Changed).To(BeTrue())
	g.Expect(released.Table.Revision).To(Equal(int64(2)))
	g.Expect(countBy(released.Table.Holders())).To(Equal(countBy(r.Table.Holders())), "nothing is granted before an acknowledgement")
	marked := 0
	for _, s := range released.Table.Slots {
		if s.Releasing {
			marked++
			g.Expect(s.Since).To(Equal(int64(2)))
		}
	}
	g.Expect(marked).To(Equal(64))
	in.ReleasesSeen[2] = t0

	in.Now = t0.Add(time.Second)
	waiting := Step(released.Table, in)
	g.Expect(waiting.Changed).To(BeFalse())
	g.Expect(waiting.Next).To(Equal(t0.Add(timeout)))

	in.Instances = readyInstances(4, 2)
	granted := Step(released.Table, in)
	g.Expect(granted.Changed).To(BeTrue())
	g.Expect(granted.Table.Revision).To(Equal(int64(3)))
	g.Expect(countBy(granted.Table.Holders())).To(Equal(map[string]int{"i-0": 64, "i-1": 64, "i-2": 64, "i-3": 64}))
	g.Expect(granted.Fence).To(BeEmpty())
	g.Expect(Step(granted.Table, in).Changed).To(BeFalse())
}

// TestStepFence: a holder that does not acknowledge is fenced at the
// deadline, not before; its slots wait until it is gone and movable, and
// then all of them, granted and releasing, go at once.
func TestStepFence(t *testing.T) {
	g := NewWithT(t)
	in := Input{Instances: readyInstances(2, 0), ReleasesSeen: map[int64]time.Time{}, DrainTimeout: timeout, Now: t0}
	table := Step(NewTable(16), in).Table
	in.Instances = readyInstances(4, 0)
	table = Step(table, in).Table
	in.ReleasesSeen[table.Revision] = t0
	slow := in.Instances["i-0"]
	in.Instances = readyInstances(4, table.Revision)
	in.Instances["i-0"] = slow

	in.Now = t0.Add(timeout - time.Nanosecond)
	r := Step(table, in)
	g.Expect(r.Fence).To(BeEmpty())
	g.Expect(r.Next).To(Equal(t0.Add(timeout)))
	table = r.Table // i-1's acknowledged slots are granted

	in.Now = t0.Add(timeout)
	r = Step(table, in)
	g.Expect(r.Fence).To(Equal([]string{"i-0"}))
	g.Expect(r.Changed).To(BeFalse())

	in.Instances["i-0"] = Instance{State: membership.StateDead, Weight: 1}
	r = Step(table, in)
	g.Expect(r.Changed).To(BeFalse(), "a fenced instance's slots wait for its fence")
	g.Expect(r.Fence).To(BeEmpty())

	in.Instances["i-0"] = Instance{State: membership.StateDead, Weight: 1, Movable: true}
	r = Step(table, in)
	g.Expect(r.Changed).To(BeTrue())
	g.Expect(countBy(r.Table.Holders())).To(Equal(map[string]int{"i-1": 6, "i-2": 5, "i-3": 5}))
	for _, s := range r.Table.Slots {
		g.Expect(s.Releasing).To(BeFalse())
	}
}

// TestStepRestartKeepsSlots: an instance restarting, then ready again,
// keeps its slots: no table write in between.
func TestStepRestartKeepsSlots(t *testing.T) {
	g := NewWithT(t)
	in := Input{Instances: readyInstances(3, 0), DrainTimeout: timeout, Now: t0}
	table := Step(NewTable(64), in).Table
	in.Instances["i-1"] = Instance{State: membership.StateRestarting, Weight: 1}
	r := Step(table, in)
	g.Expect(r.Changed).To(BeFalse())
	in.Instances["i-1"] = Instance{State: membership.StateReady, Weight: 1}
	g.Expect(Step(table, in).Changed).To(BeFalse())
}

// TestStepSafety runs the state machine on random histories: instances
// join, expire, come back, acknowledge or not, die and are held, and time
// passes. After every step it checks the guarantees: a slot passes from a
// holder to another only after the holder acknowledged its release or is
// gone and movable; a slot is granted only to a ready instance; only ready
// holders of a release past its deadline are fenced; and once membership
// settles and every instance acknowledges, the table reaches the plan and
// stays there.
func TestStepSafety(t *testing.T) {
	rnd := rand.New(rand.NewPCG(21, 22))
	states := []membership.State{membership.StateExpired, membership.StateUncertain, membership.StateVanished, membership.StateRestarting, membership.StateDead}
	for run := range 300 {
		g := NewWithT(t)
		count := 1 + rnd.IntN(200)
		n := 1 + rnd.IntN(8)
		instances := map[string]Instance{}
		for i := range n {
			instances["i-"+strconv.Itoa(i)] = Instance{State: membership.StateReady, Weight: 1 + rnd.IntN(3)}
		}
		in := Input{Instances: instances, ReleasesSeen: map[int64]time.Time{}, DrainTimeout: timeout, Now: t0}
		table := NewTable(count)
		for step := range 60 {
			// The world changes.
			for id, inst := range instances {
				switch rnd.IntN(10) {
				case 0:
					inst.State = states[rnd.IntN(len(states))]
					inst.Movable = inst.State.Gone() && rnd.IntN(2) == 0
				case 1, 2:
					inst.State, inst.Movable = membership.StateReady, false
				case 3, 4, 5:
					if inst.State.Ready() {
						inst.Acknowledged = table.Revision // it let go of what the current table asked
					}
				}
				instances[id] = inst
			}
			in.Now = in.Now.Add(time.Duration(rnd.IntN(20)) * time.Second)

			r := Step(table, in)
			for s, next := range r.Table.Slots {
				prev := table.Slots[s]
				if next.Holder != "" && (next.Holder != prev.Holder || !next.Releasing && prev.Releasing) {
					g.Expect(instances[next.Holder].State.Ready()).To(BeTrue(), "run %d step %d slot %d granted to %s", run, step, s, next.Holder)
				}
				if prev.Holder == "" || next.Holder == prev.Holder {
					continue
				}
				holder := instances[prev.Holder]
				acknowledged := prev.Releasing && holder.Acknowledged >= prev.Since
				g.Expect(acknowledged || holder.State.Gone() && holder.Movable).To(BeTrue(),
					"run %d step %d: slot %d passed from %s (%+v, %+v) to %s", run, step, s, prev.Holder, prev, holder, next.Holder)
			}
			// What the webhook checks a table write by (Leaving) allows
			// every write Step makes: a holder losing slots acknowledged
			// their releases, or is gone and movable.
			for id, need := range Leaving(table, r.Table) {
				holder := instances[id]
				g.Expect(need != Unacknowledged && holder.Acknowledged >= need || holder.State.Gone() && holder.Movable).To(BeTrue(),
					"run %d step %d: %s loses slots needing %d (%+v)", run, step, id, need, holder)
			}
			for _, id := range r.Fence {
				g.Expect(instances[id].State.Ready()).To(BeTrue())
				late := false
				for _, s := range table.Slots {
					seen, ok := in.ReleasesSeen[s.Since]
					if s.Holder == id && s.Releasing && instances[id].Acknowledged < s.Since && ok && !in.Now.Before(seen.Add(timeout)) {
						late = true
					}
				}
				g.Expect(late).To(BeTrue(), "run %d step %d: %s fenced with no late release", run, step, id)
			}
			if r.Changed {
				for _, s := range r.Table.Slots {
					if s.Releasing && s.Since == r.Table.Revision {
						in.ReleasesSeen[s.Since] = in.Now
					}
				}
			}
			table = r.Table
		}

		// Membership settles: everyone still around is ready and
		// acknowledges every table it sees.
		for id, inst := range instances {
			if inst.State.Gone() {
				inst.Movable = true
			} else {
				inst.State = membership.StateReady
			}
			instances[id] = inst
		}
		settled := false
		for range 4 {
			for id, inst := range instances {
				if inst.State.Ready() {
					inst.Acknowledged = table.Revision
					instances[id] = inst
				}
			}
			r := Step(table, in)
			if !r.Changed {
				settled = true
				break
			}
			table = r.Table
		}
		g.Expect(settled).To(BeTrue(), "run %d: the table did not settle", run)
		var members []Member
		for id, inst := range instances {
			if inst.State.Ready() {
				members = append(members, Member{ID: id, Weight: inst.Weight})
			}
		}
		if len(members) > 0 {
			g.Expect(table.Holders()).To(Equal(Plan(table.Holders(), members)), "run %d", run)
			for _, s := range table.Slots {
				g.Expect(s.Releasing).To(BeFalse())
			}
		}
	}
}
