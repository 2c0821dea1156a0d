package webhook

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
)

// ringBuilds keeps, for every ring, its membership and its ring as this
// replica observes them, built off the request path: the informers' event
// handlers record each Lease in the tracker as it arrives and wake the
// ring's builder goroutine when a ready instance came or went or changed
// its weight; the builder builds the ring and publishes it with an atomic
// pointer. A request reads the last ring published and never waits for a
// build.
//
// The ring a request reads may be older than the membership (a build is
// running, or has yet to start): its pick is then used only while the
// tracker says that instance is ready at the request's time, so the
// webhook never places an object on an instance that is not ready, which
// the sharder would not do either. A ready instance that the ring in use
// does not know yet is not picked until its build is published; an object
// placed meanwhile on another ready instance is moved by the sharder with a
// drain, as docs/design.md §5 allows.
//
// It is a Runnable: Start returns when its context ends, and stops the
// builders.
type ringBuilds struct {
	cache client.Reader // rings and Leases
	clock clock.Clock
	log   logr.Logger
	// synced reports whether the ring and Lease informers have synced: a
	// build waits for it rather than build rings of a partial membership,
	// one after the other, while the first list arrives.
	synced func() bool

	tracker membership.Tracker
	rings   *ringbuilds.Builds // shared with the assignment by sharder run

	ctx    context.Context // the builders' context, cancelled by Start's end
	cancel context.CancelFunc

	mu     sync.Mutex
	byName map[string]*ringBuild
}

// ringBuild is one ring's builder and its last build.
type ringBuild struct {
	name string
	// spec is what the event handlers need of the ring, replaced as the
	// ring changes.
	spec atomic.Pointer[ringSpec]
	// built is the last ring built, nil before the first build ends.
	built  atomic.Pointer[builtRing]
	wake   chan struct{} // capacity 1: wakes coalesce
	cancel context.CancelFunc
}

// ringSpec is what the Lease event handlers need of a ring.
type ringSpec struct {
	leaseNamespace string
	restartHold    time.Duration
}

// builtRing is a published build: immutable.
type builtRing struct {
	ring ring.Ring // nil when err is set
	err  error
}

func newRingBuilds(cache client.Reader, rings *ringbuilds.Builds, clk clock.Clock, log logr.Logger, synced func() bool) *ringBuilds {
	ctx, cancel := context.WithCancel(context.Background())
	return &ringBuilds{cache: cache, rings: rings, clock: clk, log: log, synced: synced, ctx: ctx, cancel: cancel, byName: map[string]*ringBuild{}}
}

// Start waits for ctx to end and stops the builders.
func (b *ringBuilds) Start(ctx context.Context) error {
	<-ctx.Done()
	b.cancel()
	return nil
}

// NeedLeaderElection: every replica serves the webhook.
func (b *ringBuilds) NeedLeaderElection() bool { return false }

// built returns the last ring published for name; nil before its first
// build ended.
func (b *ringBuilds) built(name string) *builtRing {
	b.mu.Lock()
	rb := b.byName[name]
	b.mu.Unlock()
	if rb == nil {
		return nil
	}
	return rb.built.Load()
}

// ready reports whether instance id of ring is ready now, as this replica
// last observed its Lease.
func (b *ringBuilds) ready(ringName, id string, now time.Time) bool {
	return b.tracker.Ready(ringName, id, now)
}

// ringChanged records a new or changed ring and wakes its builder when the
// ring is new or its spec changed: a write of its status alone changes
// neither its membership nor its algorithm. A ring of unit Slots gets no
// builder: the assigning webhook gives its objects a slot, a function of
// the object's key alone, and reads neither a ring nor its members.
func (b *ringBuilds) ringChanged(old, rg *v1alpha1.ControllerRing) {
	if rg.Spec.AssignsSlots() {
		// The unit never changes; a ring of unit Objects replaced by one
		// of unit Slots under its name, its deletion unseen, is dropped.
		if b.ring(rg.Name) != nil {
			b.ringDeleted(rg.Name)
		}
		return
	}
	spec := &ringSpec{leaseNamespace: rg.Spec.LeaseNamespace, restartHold: rg.Spec.EffectiveRestartHold()}
	b.mu.Lock()
	rb := b.byName[rg.Name]
	if rb == nil {
		ctx, cancel := context.WithCancel(b.ctx)
		rb = &ringBuild{name: rg.Name, wake: make(chan struct{}, 1), cancel: cancel}
		rb.spec.Store(spec) // before the Lease handlers can find it
		b.byName[rg.Name] = rb
		go b.run(ctx, rb)
	}
	b.mu.Unlock()
	if prev := rb.spec.Swap(spec); prev != spec && prev.leaseNamespace != spec.leaseNamespace {
		// The Leases of the old namespace are no members any more; the
		// builder observes those of the new one.
		b.tracker.Forget(rg.Name)
	}
	if old == nil || old.Generation != rg.Generation || old.UID != rg.UID {
		rb.poke()
	}
}

// ringDeleted stops the ring's builder and drops what is kept of it.
func (b *ringBuilds) ringDeleted(name string) {
	b.mu.Lock()
	rb := b.byName[name]
	delete(b.byName, name)
	b.mu.Unlock()
	if rb != nil {
		rb.cancel()
	}
	b.rings.Forget(name)
	b.tracker.Forget(name)
}

// leaseChanged records a Lease's new version (nil: deleted) in the tracker
// and wakes the builder of each ring whose ready instances or weights it
// changes. It takes constant time: a renewal of a ready instance wakes
// nobody.
func (b *ringBuilds) leaseChanged(old, lease *coordinationv1.Lease) {
	now := b.clock.Now()
	var oldRing string
	if old != nil {
		oldRing = old.Labels[v1alpha1.LabelRing]
	}
	if lease != nil {
		if name := lease.Labels[v1alpha1.LabelRing]; name != "" {
			b.observe(name, old, lease, now)
		}
	}
	if oldRing != "" && (lease == nil || lease.Labels[v1alpha1.LabelRing] != oldRing) {
		b.leave(oldRing, old)
	}
}

// observe records a Lease labelled for ring name.
func (b *ringBuilds) observe(name string, old, lease *coordinationv1.Lease, now time.Time) {
	rb := b.ring(name)
	if rb == nil {
		return // the ring's first build observes it
	}
	spec := rb.spec.Load()
	if lease.Namespace != spec.leaseNamespace {
		if old != nil && old.Namespace == spec.leaseNamespace {
			b.leave(name, old)
		}
		return
	}
	wasReady := b.tracker.Ready(name, lease.Name, now)
	m, _ := b.tracker.Observe(name, spec.restartHold, lease, now)
	if m.State.Ready() != wasReady || old == nil || old.Labels[v1alpha1.LabelVirtualNodes] != lease.Labels[v1alpha1.LabelVirtualNodes] {
		rb.poke()
	}
}

// leave records that a Lease is no longer in ring name.
func (b *ringBuilds) leave(name string, lease *coordinationv1.Lease) {
	rb := b.ring(name)
	if rb == nil || lease.Namespace != rb.spec.Load().leaseNamespace {
		return
	}
	b.tracker.Vanish(name, lease.Name)
	rb.poke()
}

func (b *ringBuilds) ring(name string) *ringBuild {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byName[name]
}

// poke wakes the builder; it never blocks.
func (rb *ringBuild) poke() {
	select {
	case rb.wake <- struct{}{}:
	default: // a build is pending already
	}
}

// run builds the ring each time it is woken, and at the next transition
// of its members by time alone (an instance whose renewal is overdue
// expires), until ctx ends.
func (b *ringBuilds) run(ctx context.Context, rb *ringBuild) {
	log := b.log.WithValues("ring", rb.name)
	var timer clock.Timer
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-rb.wake:
		case <-fire:
		}
		next, err := b.build(ctx, rb)
		if ctx.Err() != nil {
			// Stopped during the build, which may have recorded the ring
			// again: drop it, unless a ring of the same name came since.
			b.mu.Lock()
			if b.byName[rb.name] == nil {
				b.rings.Forget(rb.name)
				b.tracker.Forget(rb.name)
			}
			b.mu.Unlock()
			return
		}
		if err != nil {
			log.Error(err, "Cannot read the ring's membership; requests use the ring built last")
			next = b.clock.Now().Add(time.Second)
		}
		if timer != nil {
			timer.Stop()
			timer, fire = nil, nil
		}
		if !next.IsZero() {
			timer = b.clock.NewTimer(next.Sub(b.clock.Now()))
			fire = timer.C()
		}
	}
}

// build computes the ring's membership from the cached Leases, rebuilds the
// ring when its ready instances or weights changed, and publishes it. It
// returns the next transition of a member by time alone.
func (b *ringBuilds) build(ctx context.Context, rb *ringBuild) (time.Time, error) {
	if !b.synced() {
		return b.clock.Now().Add(100 * time.Millisecond), nil
	}
	rg := &v1alpha1.ControllerRing{}
	// Read only: the cached object itself, not a copy of its status.
	if err := b.cache.Get(ctx, types.NamespacedName{Name: rb.name}, rg, client.UnsafeDisableDeepCopy); err != nil {
		if apierrors.IsNotFound(err) {
			return time.Time{}, nil // its deletion stops this builder
		}
		return time.Time{}, fmt.Errorf("reading ControllerRing %q: %w", rb.name, err)
	}
	list := &coordinationv1.LeaseList{}
	if err := b.cache.List(ctx, list, client.InNamespace(rg.Spec.LeaseNamespace),
		client.MatchingLabels{v1alpha1.LabelRing: rg.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return time.Time{}, fmt.Errorf("listing the Leases of ring %q: %w", rg.Name, err)
	}
	members, next := b.tracker.Members(rg.Name, rg.Spec.EffectiveRestartHold(), list.Items, b.clock.Now())
	// The ring may come from the assignment's build (the Rings are
	// shared): it is published whenever it is not the one published.
	r, rebuilt, err := b.rings.Build(rg.Name, rg.Spec.EffectiveAlgorithm(), rg.Spec.EffectiveVirtualNodes(), members)
	switch published := rb.built.Load(); {
	case err != nil:
		rb.built.Store(&builtRing{err: err})
	case published == nil || published.err != nil || published.ring != r:
		rb.built.Store(&builtRing{ring: r})
		b.log.V(1).Info("Published the ring", "ring", rg.Name, "members", len(members), "built", rebuilt)
	}
	return next, nil
}

// addEventHandlers feeds b from the ring and Lease informers.
func (b *ringBuilds) addEventHandlers(rings, leases cache.Informer) error {
	_, err := rings.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if r, ok := obj.(*v1alpha1.ControllerRing); ok {
				b.ringChanged(nil, r)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, _ := oldObj.(*v1alpha1.ControllerRing)
			if r, ok := obj.(*v1alpha1.ControllerRing); ok {
				b.ringChanged(old, r)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if r, ok := obj.(*v1alpha1.ControllerRing); ok {
				b.ringDeleted(r.Name)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching rings: %w", err)
	}
	_, err = leases.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if l, ok := obj.(*coordinationv1.Lease); ok {
				b.leaseChanged(nil, l)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, _ := oldObj.(*coordinationv1.Lease)
			if l, ok := obj.(*coordinationv1.Lease); ok {
				b.leaseChanged(old, l)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if l, ok := obj.(*coordinationv1.Lease); ok {
				b.leaseChanged(l, nil)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching Leases: %w", err)
	}
	return nil
}
