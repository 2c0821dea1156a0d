// Package inflight tracks the reconciles an instance has in flight, per
// object, so that a drain is acknowledged only once no reconcile of the
// object is running, so that shutdown can wait for all of them, and so that
// they can be cancelled when their object leaves or the Lease is lost.
package inflight

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Key identifies an object across kinds.
type Key struct {
	schema.GroupKind
	types.NamespacedName
}

// Admission is Begin's answer.
type Admission int

const (
	// Admitted: the reconcile may run; the caller must call End.
	Admitted Admission = iota
	// NotOpen: the gate does not admit reconciles yet (the instance does
	// not hold its Lease yet); try again later.
	NotOpen
	// Draining: the object's drain is being acknowledged; try again later
	// (the request is dropped then if the object has left).
	Draining
	// Closed: the gate admits nothing any more (shutdown or lost Lease).
	Closed
)

func (a Admission) String() string {
	switch a {
	case Admitted:
		return "admitted"
	case NotOpen:
		return "not open"
	case Draining:
		return "draining"
	case Closed:
		return "closed"
	}
	return "unknown"
}

type entry struct {
	running  int
	draining bool
	// changed is closed and replaced whenever running drops.
	changed chan struct{}
	// cancels cancel the running reconciles begun with a cancel function,
	// by the number BeginCancellable gave them.
	cancels map[uint64]cancellable
}

// cancellable is a reconcile begun with BeginCancellable: its cancel
// function, and a channel closed when it ended.
type cancellable struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// Gate counts running reconciles per object. The zero value is not
// usable; call New. It is safe for concurrent use.
type Gate struct {
	mu      sync.Mutex
	open    bool
	closed  bool
	total   int
	objects map[Key]*entry
	// idle is closed and replaced whenever total drops.
	idle chan struct{}
	// lastCancel numbers the cancel functions.
	lastCancel uint64
}

// New returns a gate that admits nothing until Open is called.
func New() *Gate {
	return &Gate{objects: map[Key]*entry{}, idle: make(chan struct{})}
}

// Open starts admitting reconciles (unless Close was called).
func (t *Gate) Open() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.open = true
}

// Close stops admitting reconciles for good. Reconciles already admitted run
// on; Wait waits for them.
func (t *Gate) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
}

// Admitting reports whether the gate admits reconciles: opened and not
// closed.
func (t *Gate) Admitting() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.open && !t.closed
}

// Begin asks to start a reconcile of key. Only when it returns Admitted must
// the caller call End(key) once the reconcile has finished.
func (t *Gate) Begin(key Key) Admission {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return Closed
	case !t.open:
		return NotOpen
	}
	e := t.objects[key]
	if e == nil {
		e = &entry{changed: make(chan struct{})}
		t.objects[key] = e
	}
	if e.draining {
		return Draining
	}
	e.running++
	t.total++
	return Admitted
}

// BeginCancellable is Begin for a reconcile that Cancel and CancelAll may
// cancel: while it runs, they call cancel with their cause. When admitted,
// the caller must call the returned end function, in place of End, once
// the reconcile has finished; otherwise end is nil.
func (t *Gate) BeginCancellable(key Key, cancel context.CancelCauseFunc) (Admission, func()) {
	if admission := t.Begin(key); admission != Admitted {
		return admission, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.objects[key]
	if e.cancels == nil {
		e.cancels = map[uint64]cancellable{}
	}
	t.lastCancel++
	id := t.lastCancel
	c := cancellable{cancel: cancel, done: make(chan struct{})}
	e.cancels[id] = c
	return Admitted, func() {
		t.mu.Lock()
		delete(e.cancels, id)
		t.mu.Unlock()
		t.End(key)
		close(c.done)
	}
}

// Cancelled is the reconciles one call of Cancel or CancelAll cancelled.
type Cancelled []<-chan struct{}

// Running returns how many of them have not returned yet.
func (c Cancelled) Running() int {
	n := 0
	for _, done := range c {
		select {
		case <-done:
		default:
			n++
		}
	}
	return n
}

// Wait blocks until all of them have returned, and reports true, or until
// stop is closed, and reports false.
func (c Cancelled) Wait(stop <-chan time.Time) bool {
	for _, done := range c {
		select {
		case <-done:
		case <-stop:
			return false
		}
	}
	return true
}

// Cancel cancels the running reconciles of key begun with
// BeginCancellable, with cause, and returns them.
func (t *Gate) Cancel(key Key, cause error) Cancelled {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.objects[key]
	if e == nil {
		return nil
	}
	var cancelled Cancelled
	for _, c := range e.cancels {
		c.cancel(cause)
		cancelled = append(cancelled, c.done)
	}
	return cancelled
}

// CancelAll cancels every running reconcile begun with BeginCancellable, with
// cause, and returns them. Call Close first so that none is admitted after
// it.
func (t *Gate) CancelAll(cause error) Cancelled {
	t.mu.Lock()
	defer t.mu.Unlock()
	var cancelled Cancelled
	for _, e := range t.objects {
		for _, c := range e.cancels {
			c.cancel(cause)
			cancelled = append(cancelled, c.done)
		}
	}
	return cancelled
}

// RunningOf returns the number of reconciles of key in flight.
func (t *Gate) RunningOf(key Key) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.objects[key]; e != nil {
		return e.running
	}
	return 0
}

// End ends a reconcile admitted by Begin (or the drain begun by Drain).
func (t *Gate) End(key Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.objects[key]
	if e == nil || e.running == 0 {
		return // not admitted: nothing to end
	}
	e.running--
	t.total--
	close(e.changed)
	e.changed = make(chan struct{})
	if e.running == 0 {
		e.draining = false
		delete(t.objects, key)
	}
	close(t.idle)
	t.idle = make(chan struct{})
}

// Drain is called by an admitted reconcile of key that found the object's
// drain label (a caller that was not admitted gets false). It makes further Begin calls for key answer Draining and
// waits until the caller's reconcile is the only one of key still running.
// It returns false without waiting when another reconcile is already
// draining key (the caller drops its request), and ctx's error when ctx ends
// first (draining is then withdrawn). The caller calls End(key) once the
// acknowledgement is done or has failed; new reconciles of key are admitted
// again after that.
func (t *Gate) Drain(ctx context.Context, key Key) (bool, error) {
	t.mu.Lock()
	e := t.objects[key]
	if e == nil || e.running == 0 || e.draining {
		t.mu.Unlock()
		return false, nil
	}
	e.draining = true
	for e.running > 1 {
		changed := e.changed
		t.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			t.mu.Lock()
			e.draining = false
			t.mu.Unlock()
			return false, ctx.Err()
		}
		t.mu.Lock()
	}
	t.mu.Unlock()
	return true, nil
}

// Running returns the number of reconciles in flight.
func (t *Gate) Running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// Wait blocks until no reconcile is in flight or ctx ends.
func (t *Gate) Wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.total == 0 {
			t.mu.Unlock()
			return nil
		}
		idle := t.idle
		t.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
