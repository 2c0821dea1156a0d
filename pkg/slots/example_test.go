package slots_test

import (
	"fmt"
	"time"

	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// A ring of 16 slots grows from 3 instances to 4: the sharder releases the
// new instance's share from the others in one table write, each of them
// lets go and acknowledges that revision on its Lease, and the sharder
// grants the slots in a second write. No object is written.
func ExampleStep() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ready := func(acknowledged int64) slots.Instance {
		return slots.Instance{State: membership.StateReady, Weight: 1, Acknowledged: acknowledged}
	}
	in := slots.Input{
		Instances:    map[string]slots.Instance{"a": ready(0), "b": ready(0), "c": ready(0)},
		ReleasesSeen: map[int64]time.Time{},
		DrainTimeout: 30 * time.Second,
		Now:          now,
	}
	table := slots.Step(slots.NewTable(16), in).Table
	fmt.Println("revision", table.Revision, table.Status().Instances)

	in.Instances["d"] = ready(0)
	r := slots.Step(table, in)
	in.ReleasesSeen[r.Table.Revision] = now // the sharder saw its write land
	fmt.Println("revision", r.Table.Revision, r.Table.Status().Instances)

	// Each instance that gave up slots acknowledges revision 2 on its Lease.
	in.Instances["a"], in.Instances["b"], in.Instances["c"] = ready(2), ready(2), ready(2)
	r = slots.Step(r.Table, in)
	fmt.Println("revision", r.Table.Revision, r.Table.Status().Instances)

	fmt.Println("changed again:", slots.Step(r.Table, in).Changed)
	// Output:
	// revision 1 [{a 0-5 []} {b 6-10 []} {c 11-15 []}]
	// revision 2 [{a 0-3 [{2 4-5}]} {b 6-9 [{2 10}]} {c 11-14 [{2 15}]}]
	// revision 3 [{a 0-3 []} {b 6-9 []} {c 11-14 []} {d 4-5,10,15 []}]
	// changed again: false
}
