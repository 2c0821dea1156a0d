package assign

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// drainTimes remembers when the drain of each object started, and when a
// forced move released it, keyed by UID. It is safe for concurrent use. It
// is the sharder's bookkeeping, in memory: after a restart, a drain it has
// not seen begin counts from the start written on the object
// (ringAssigner.drainStarted), and Released
// counts a release it has not seen written from when it first sees it.
type drainTimes struct {
	clock    clock.PassiveClock
	mu       sync.Mutex
	started  map[types.UID]time.Time
	released map[types.UID]release
}

// release is a forced release as the sharder observed it: when, and how
// long the object waits before it is assigned.
type release struct {
	at    time.Time
	grace time.Duration
}

// newDrainTimes returns an empty drainTimes reading time from c (nil: the real clock).
func newDrainTimes(c clock.PassiveClock) *drainTimes {
	if c == nil {
		c = clock.RealClock{}
	}
	return &drainTimes{clock: c, started: map[types.UID]time.Time{}, released: map[types.UID]release{}}
}

// Begin records that the drain of uid starts now, unless one is already
// recorded, and returns the start.
func (t *drainTimes) Begin(uid types.UID) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	start, ok := t.started[uid]
	if !ok {
		start = t.clock.Now()
		t.started[uid] = start
	}
	return start
}

// BeginAt records that the drain of uid started at start, unless one is
// already recorded, and returns the recorded start.
func (t *drainTimes) BeginAt(uid types.UID, start time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if recorded, ok := t.started[uid]; ok {
		return recorded
	}
	t.started[uid] = start
	return start
}

// Deadline returns when the drain of uid times out: its recorded start plus
// timeout. A drain with no recorded start (one that was in flight when the
// sharder started) is recorded as starting now.
func (t *drainTimes) Deadline(uid types.UID, timeout time.Duration) time.Time {
	return t.Begin(uid).Add(timeout)
}

// Started returns when the drain of uid was recorded to start; false when
// none is recorded.
func (t *drainTimes) Started(uid types.UID) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	start, ok := t.started[uid]
	return start, ok
}

// Release records that the sharder's write releasing uid by a forced move
// returned now (the write landed at the latest then), and that the object
// is assigned grace after that.
func (t *drainTimes) Release(uid types.UID, grace time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.released[uid] = release{at: t.clock.Now(), grace: grace}
}

// Released returns when the release of uid was recorded and its grace. A
// release with no record (written by a previous leader, or by a write whose
// reply was lost) is recorded as observed now, with grace: it landed before
// the sharder saw it.
func (t *drainTimes) Released(uid types.UID, grace time.Duration) (time.Time, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.released[uid]
	if !ok {
		r = release{at: t.clock.Now(), grace: grace}
		t.released[uid] = r
	}
	return r.at, r.grace
}

// End forgets the drain of uid, and its release, and returns how long the
// drain lasted; false when no drain of uid was recorded.
func (t *drainTimes) End(uid types.UID) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.released, uid)
	start, ok := t.started[uid]
	if !ok {
		return 0, false
	}
	delete(t.started, uid)
	return t.clock.Since(start), true
}

// Len returns the number of drains recorded.
func (t *drainTimes) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.started)
}
