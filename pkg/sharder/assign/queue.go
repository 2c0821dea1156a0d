package assign

// urgencyQueue is the order of a ring's work queue: two FIFO lists, the
// urgent one served first. An item is classified when it enters the queue
// and again when it is added while waiting, so an object that became urgent
// (a drain acknowledged while its request was still queued) moves ahead.
//
// Urgent are the objects that wait for nothing but the sharder: unassigned
// objects (new ones and acknowledged drains) and objects of dead instances.
// Without the split, the acknowledged objects of a rebalance would wait
// behind every drain request the rebalance queued before them.
//
// It implements workqueue.Queue: the workqueue calls it under its own lock,
// from one goroutine at a time, and never pushes an item that is queued.
type urgencyQueue struct {
	urgent func(item) bool
	lists  [2][]item    // urgent, then normal; may hold stale entries
	queued map[item]int // queued items and the list that holds them
	peak   int          // most items queued since queued was last made
}

// shrinkAfter is the peak number of queued items above which the queue's
// map is made anew once the queue is empty: a Go map keeps the memory of its
// largest size, and a rebalance can queue every object of the ring.
const shrinkAfter = 1024

func newUrgencyQueue(urgent func(item) bool) *urgencyQueue {
	return &urgencyQueue{urgent: urgent, queued: map[item]int{}}
}

func (q *urgencyQueue) class(it item) int {
	if q.urgent(it) {
		return 0
	}
	return 1
}

// Push adds an item that is not queued.
func (q *urgencyQueue) Push(it item) {
	c := q.class(it)
	q.lists[c] = append(q.lists[c], it)
	q.queued[it] = c
	q.peak = max(q.peak, len(q.queued))
}

// Touch is called when a queued item is added again: it moves to the urgent
// list when it became urgent. The entry left in the normal list is skipped
// by Pop.
func (q *urgencyQueue) Touch(it item) {
	if c, ok := q.queued[it]; ok && c == 1 && q.urgent(it) {
		q.lists[0] = append(q.lists[0], it)
		q.queued[it] = 0
	}
}

// Len returns the number of queued items.
func (q *urgencyQueue) Len() int { return len(q.queued) }

// Pop returns the oldest urgent item, else the oldest other one. The
// workqueue calls it only when Len is positive.
func (q *urgencyQueue) Pop() item {
	for c := range q.lists {
		for len(q.lists[c]) > 0 {
			it := q.lists[c][0]
			q.lists[c][0] = item{}
			q.lists[c] = q.lists[c][1:]
			if len(q.lists[c]) == 0 {
				q.lists[c] = nil // let the backing array go
			}
			if at, ok := q.queued[it]; ok && at == c {
				delete(q.queued, it)
				if len(q.queued) == 0 && q.peak > shrinkAfter {
					q.queued, q.peak = map[item]int{}, 0
					q.lists = [2][]item{}
				}
				return it
			}
		}
	}
	return item{}
}
