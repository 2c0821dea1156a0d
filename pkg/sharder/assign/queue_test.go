package assign

import (
	"fmt"
	"slices"
	"testing"

	"k8s.io/utils/clock"
)

func TestUrgencyQueueServesUrgentItemsFirst(t *testing.T) {
	it := func(name string) item {
		return item{namespace: "ns", name: name}
	}
	urgent := map[item]bool{}
	q := newUrgencyQueue(func(i item) bool { return urgent[i] })
	pop := func() []string {
		var got []string
		for q.Len() > 0 {
			got = append(got, q.Pop().name)
		}
		return got
	}

	// Urgent items overtake, each list keeps its order.
	urgent[it("u1")], urgent[it("u2")] = true, true
	for _, n := range []string{"a", "u1", "b", "u2", "c"} {
		q.Push(it(n))
	}
	if got, want := pop(), []string{"u1", "u2", "a", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("order = %v, want %v", got, want)
	}

	// An item that becomes urgent while queued moves ahead once.
	for _, n := range []string{"a", "b", "c"} {
		q.Push(it(n))
	}
	urgent[it("c")] = true
	q.Touch(it("c"))
	q.Touch(it("c"))
	q.Touch(it("a")) // not urgent: stays
	if got, want := pop(), []string{"c", "a", "b"}; !slices.Equal(got, want) {
		t.Errorf("order after promotion = %v, want %v", got, want)
	}

	// A promoted item pushed again after its Pop is delivered once, even
	// though its first entry is still in the normal list.
	urgent = map[item]bool{}
	q.Push(it("x"))
	q.Push(it("y"))
	urgent[it("x")] = true
	q.Touch(it("x"))
	if got := q.Pop().name; got != "x" {
		t.Fatalf("Pop = %q, want x", got)
	}
	urgent[it("x")] = false
	q.Push(it("x"))
	if got, want := pop(), []string{"y", "x"}; !slices.Equal(got, want) && !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("order = %v, want y and x once each", got)
	}
	if q.Len() != 0 {
		t.Errorf("Len = %d after draining", q.Len())
	}
}

// After a burst the queue lets go of the memory it grew to.
func TestUrgencyQueueShrinksWhenEmptyAfterBurst(t *testing.T) {
	q := newUrgencyQueue(func(i item) bool { return i.name[0] == 'u' })
	for i := range 3 * shrinkAfter {
		q.Push(item{name: fmt.Sprintf("n%d", i)})
		q.Push(item{name: fmt.Sprintf("u%d", i)})
	}
	seen := map[item]bool{}
	for q.Len() > 0 {
		it := q.Pop()
		if seen[it] {
			t.Fatalf("%v delivered twice", it)
		}
		seen[it] = true
	}
	if len(seen) != 6*shrinkAfter {
		t.Errorf("delivered %d items, want %d", len(seen), 6*shrinkAfter)
	}
	if q.peak != 0 || cap(q.lists[0]) != 0 || cap(q.lists[1]) != 0 {
		t.Errorf("queue kept its burst's memory: peak %d, list capacities %d and %d", q.peak, cap(q.lists[0]), cap(q.lists[1]))
	}
	q.Push(item{name: "n"})
	if q.Len() != 1 || q.Pop().name != "n" {
		t.Error("queue unusable after shrinking")
	}
}

// BenchmarkWorkQueueCycle is the work queue's cost per object: added,
// classified, taken by a worker, done and forgotten, 10,000 distinct
// objects at a time.
func BenchmarkWorkQueueCycle(b *testing.B) {
	const n = 10000
	items := make([]item, n)
	for i := range items {
		items[i] = benchItem(i)
	}
	q := newWorkQueue(clock.RealClock{}, func(item) bool { return false })
	defer q.ShutDown()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += n {
		for _, it := range items[:min(n, b.N-i)] {
			q.Add(it)
		}
		for range min(n, b.N-i) {
			it, _ := q.Get()
			q.Done(it)
			q.Forget(it)
		}
	}
}
