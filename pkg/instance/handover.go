package instance

import (
	"sync"
	"time"

	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
)

// handOverMemory is how long an instance remembers that it handed an object
// over. The requests that the object's departure from the cache queues are
// handled well within it; a request handled later reads the API server, as
// for any object that left.
const handOverMemory = time.Minute

// handOvers remembers when this instance acknowledged the drain of each
// object, for handOverMemory. Every controller that wraps the object's kind
// gets a request when it leaves the cache, so an entry is not consumed by
// the first: it ends when the object is back, or when it is older than
// handOverMemory (swept as new ones are added).
type handOvers struct {
	mu        sync.Mutex
	at        map[inflight.Key]time.Time
	lastSweep time.Time
}

func (h *handOvers) add(key inflight.Key, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.at == nil {
		h.at = map[inflight.Key]time.Time{}
	}
	if now.Sub(h.lastSweep) >= handOverMemory {
		for k, t := range h.at {
			if now.Sub(t) >= handOverMemory {
				delete(h.at, k)
			}
		}
		h.lastSweep = now
	}
	h.at[key] = now
}

// recent reports whether key was handed over less than handOverMemory ago.
func (h *handOvers) recent(key inflight.Key, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.at[key]
	return ok && now.Sub(t) < handOverMemory
}

// forget ends the entry of key: the object is assigned here again.
func (h *handOvers) forget(key inflight.Key) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.at, key)
}
