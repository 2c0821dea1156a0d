package slots

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// simInstance is an instance process in TestProtocolExclusive: its own
// record of the slots it holds (what it admits reconciles for), the table
// revision its watch has reached, and its Lease as the sharder sees it.
type simInstance struct {
	record Record
	view   int64 // the revision of the newest table its watch delivered
	lease  Instance
}

// TestProtocolExclusive runs the whole protocol, the sharder's Step and the
// instances' records, on random histories in which every instance's watch
// of the ring lags by a random number of table revisions (never going
// back), the sharder's view of the Leases lags as well, and instances stop,
// expire, come back and are fenced. After every event no slot is in the
// records of two instances: no object is reconciled by two instances at
// once. The sharder's table writes land a while after it decided them, as
// over a real API server.
//
// What the model takes from §3 and §11: an instance that
// stops or loses its Lease empties its record before the sharder sees it
// gone; an instance that comes back reads the current table; a dead
// instance's Lease is held by the sharder (it cannot come back) from when
// its slots may move until the table grants it none; an instance
// acknowledges only a table it applied to its record.
func TestProtocolExclusive(t *testing.T) {
	rnd := rand.New(rand.NewPCG(31, 32))
	for run := range 200 {
		count := 1 + rnd.IntN(64)
		n := 2 + rnd.IntN(6)
		ids := make([]string, n)
		procs := map[string]*simInstance{}
		for i := range ids {
			ids[i] = "i-" + strconv.Itoa(i)
			procs[ids[i]] = &simInstance{lease: Instance{State: membership.StateReady, Weight: 1 + rnd.IntN(3)}}
		}
		history := []Table{NewTable(count)} // history[r] is the table of revision r
		latest := func() Table { return history[len(history)-1] }
		in := Input{ReleasesSeen: map[int64]time.Time{}, DrainTimeout: timeout, Now: t0}
		var pending *Table // a table write the sharder sent that has not landed yet

		checkExclusive := func(event string) {
			owner := map[int]string{}
			for _, id := range ids {
				for _, slot := range procs[id].record.Slots {
					if other, taken := owner[slot]; taken {
						t.Fatalf("run %d, after %s: slot %d is in the records of %s and %s", run, event, slot, other, id)
					}
					owner[slot] = id
				}
			}
		}

		for step := range 150 {
			id := ids[rnd.IntN(n)]
			p := procs[id]
			switch event := rnd.IntN(12); {
			case event < 5 && p.lease.State.Ready(): // its watch catches up some
				p.view += int64(rnd.IntN(int(int64(len(history)) - p.view)))
				var ok bool
				p.record, _, _, ok = p.record.Apply(id, history[p.view])
				if ok || p.record.Revision == p.view {
					p.lease.Acknowledged = p.record.Revision // renews at once with the acknowledgement
				}
			case event == 5 && p.lease.State.Ready(): // stops for good, or stops renewing
				if rnd.IntN(2) == 0 {
					p.record = Record{}
					p.lease.State = membership.StateDead
				} else {
					p.lease.State = membership.StateExpired
				}
			case event == 6 && p.lease.State == membership.StateExpired: // proven gone: stopped by its deadline
				p.record = Record{}
				p.lease.State = membership.StateDead
			case event == 7 && p.lease.State == membership.StateExpired: // renews again
				p.lease.State = membership.StateReady
			case event == 8 && p.lease.State.Gone():
				p.lease.Movable = true // the sharder holds its Lease, or the fence's wait is over
			case event == 9 && p.lease.State.Gone(): // comes back, unless the sharder holds its Lease
				granted, releasing := latest().HeldBy(id)
				if p.lease.Movable && len(granted)+len(releasing) > 0 {
					break
				}
				p.lease = Instance{State: membership.StateReady, Weight: p.lease.Weight}
				p.view = int64(len(history) - 1) // reads the current table after acquiring its Lease
				p.record = Record{}
				p.record, _, _, _ = p.record.Apply(id, history[p.view])
				p.lease.Acknowledged = p.record.Revision
			default: // time passes and the sharder steps
				in.Now = in.Now.Add(time.Duration(rnd.IntN(40)) * time.Second)
				if in.Instances == nil || rnd.IntN(2) == 0 { // the sharder's view of the Leases may be behind
					in.Instances = map[string]Instance{}
					for _, id := range ids {
						in.Instances[id] = procs[id].lease
					}
				}
				// A table write lands some events after the sharder decided it,
				// and only on the table it was decided on (the resourceVersion
				// lock); meanwhile instances act on the table before it.
				if pending != nil && pending.Revision == int64(len(history)) {
					history = append(history, *pending)
					in.ReleasesSeen[pending.Revision] = in.Now
				}
				pending = nil
				r := Step(latest(), in)
				if r.Changed {
					pending = &r.Table
				}
				for _, f := range r.Fence { // the fenced instance stops; its slots wait for the fence
					if procs[f].lease.State.Ready() { // the takeover is locked on the Lease the sharder read
						procs[f].record = Record{}
						procs[f].lease = Instance{State: membership.StateDead, Weight: procs[f].lease.Weight}
					}
				}
			}
			checkExclusive("step " + strconv.Itoa(step))
		}
	}
}
