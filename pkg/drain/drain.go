package drain

import (
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// LabelValue is the value of the drain label.
const LabelValue = "true"

// Requested reports whether obj carries ring's drain label (any value).
func Requested(obj metav1.Object, ring string) bool {
	_, ok := obj.GetLabels()[v1alpha1.DrainLabel(ring)]
	return ok
}

// RequestPatch returns a JSON merge patch that sets ring's drain label on an
// object whose current resourceVersion is resourceVersion. The API server
// rejects it with a Conflict when the object changed since: the caller then
// re-reads the object and decides again, so a drain is never requested on a
// state the sharder has not seen.
func RequestPatch(ring, resourceVersion string) []byte {
	return LabelPatch(resourceVersion, map[string]*string{v1alpha1.DrainLabel(ring): ptr.To(LabelValue)})
}

// Tracker remembers when the drain of each object started, keyed by UID. It
// is safe for concurrent use. It lives in memory only: after a restart,
// Deadline starts a fresh timeout for a drain it has not seen begin.
type Tracker struct {
	clock   clock.PassiveClock
	mu      sync.Mutex
	started map[types.UID]time.Time
}

// NewTracker returns an empty Tracker reading time from c (nil: the real clock).
func NewTracker(c clock.PassiveClock) *Tracker {
	if c == nil {
		c = clock.RealClock{}
	}
	return &Tracker{clock: c, started: map[types.UID]time.Time{}}
}

// Begin records that the drain of uid starts now, unless one is already
// recorded, and returns the start.
func (t *Tracker) Begin(uid types.UID) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	start, ok := t.started[uid]
	if !ok {
		start = t.clock.Now()
		t.started[uid] = start
	}
	return start
}

// Deadline returns when the drain of uid times out: its recorded start plus
// timeout. A drain with no recorded start (one that was in flight when the
// sharder started) is recorded as starting now.
func (t *Tracker) Deadline(uid types.UID, timeout time.Duration) time.Time {
	return t.Begin(uid).Add(timeout)
}

// Started returns when the drain of uid was recorded to start; false when
// none is recorded.
func (t *Tracker) Started(uid types.UID) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	start, ok := t.started[uid]
	return start, ok
}

// End forgets the drain of uid and returns how long it lasted; false when no
// drain of uid was recorded.
func (t *Tracker) End(uid types.UID) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	start, ok := t.started[uid]
	if !ok {
		return 0, false
	}
	delete(t.started, uid)
	return t.clock.Since(start), true
}

// Len returns the number of drains recorded.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.started)
}
