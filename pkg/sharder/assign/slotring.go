package assign

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/slotlabel"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// slotRing serves a ring of unit Slots (docs/design.md §11): it runs the
// ring's slot labeler and writes the ring's status but its slot table,
// which is the slot table controller's (pkg/sharder/slottable). It assigns
// nothing itself: no object of the ring gets a shard or drain label, and
// the instances' slot counts in the Registry are the table controller's.
// One slotRing serves one configuration of the ring's resources and
// namespaces (its labeler reads them when built); the controller replaces
// it when they change.
type slotRing struct {
	c       *Controller
	name    string
	logger  logr.Logger
	cfg     atomic.Pointer[ringConfig]
	labeler *slotlabel.Labeler

	status chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// newSlotRing builds the slot labeler of ring, resolved as cfg.
func newSlotRing(c *Controller, ring *v1alpha1.ControllerRing, cfg *ringConfig) (*slotRing, error) {
	s := &slotRing{
		c:      c,
		name:   ring.Name,
		logger: c.logger.WithValues("ring", ring.Name),
		status: make(chan struct{}, 1),
	}
	s.cfg.Store(cfg)
	l, err := slotlabel.New(slotlabel.Options{
		Ring:         ring,
		Client:       c.meta,
		Writer:       c.writer,
		Mapper:       c.mapper,
		Namespaces:   cfg.namespaces,
		Workers:      c.opts.Workers,
		FieldManager: c.opts.FieldManager,
		Recorder:     c.recorder,
		ResyncPeriod: *c.opts.ResyncPeriod,
		Logger:       c.logger.WithName("slotlabel").WithValues("ring", ring.Name),
	})
	if err != nil {
		return nil, err
	}
	s.labeler = l
	return s, nil
}

// config returns the configuration the ring is served with.
func (s *slotRing) config() *ringConfig { return s.cfg.Load() }

// sameLabeler reports whether a labeler built for b would watch and label
// what s's does: the same resources, resolved alike, in the same
// namespaces, selected by the same namespaceSelector.
func (s *slotRing) sameLabeler(b *ringConfig) bool {
	a := s.config()
	return a.uid == b.uid && a.sameWatches(b) && slices.Equal(a.unresolved, b.unresolved) &&
		selectorString(a) == selectorString(b)
}

func selectorString(cfg *ringConfig) string {
	if cfg.selector == nil {
		return ""
	}
	return cfg.selector.String()
}

// reconfigure takes a new generation of the ring that the labeler serves
// as it is.
func (s *slotRing) reconfigure(cfg *ringConfig) {
	s.cfg.Store(cfg)
	s.triggerStatus()
}

// start runs the labeler and the status writer until stop or ctx is done.
func (s *slotRing) start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	ctx = logf.IntoContext(ctx, s.logger)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.labeler.Start(ctx); err != nil {
			s.logger.Error(err, "Slot labeler stopped")
		}
	}()
	go func() {
		defer s.wg.Done()
		s.statusLoop(ctx)
	}()
}

// stop stops the ring and waits for its goroutines.
func (s *slotRing) stop() {
	s.cancel()
	s.wg.Wait()
}

// notifyMembership asks for a status write; it never blocks.
func (s *slotRing) notifyMembership() { s.triggerStatus() }

func (s *slotRing) triggerStatus() {
	select {
	case s.status <- struct{}{}:
	default:
	}
}

// statusLoop writes the ring's status when asked and every StatusInterval:
// the count of unlabelled objects and the slot table (read from the
// ring) change without telling. A write is skipped when nothing changed,
// so an idle ring costs a read of the cached ring per interval.
func (s *slotRing) statusLoop(ctx context.Context) {
	clk := s.c.opts.Clock
	interval := *s.c.opts.StatusInterval
	tick := clk.NewTicker(interval)
	defer tick.Stop()
	var last time.Time
	for {
		if wait := interval - clk.Since(last); !last.IsZero() && wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-clk.After(wait):
			}
		}
		last = clk.Now()
		if err := s.writeStatus(ctx); err != nil && ctx.Err() == nil {
			s.logger.Error(err, "Cannot write ring status")
		}
		select {
		case <-ctx.Done():
			return
		case <-s.status:
		case <-tick.C():
		}
	}
}

// writeStatus computes the ring's status and writes it when it differs
// from the cached ring's. The write is a merge patch of the fields it
// changes, never of status.slots, and is not locked on the ring's
// resourceVersion: the slot table controller writes status.slots locked on
// it, and this writer neither reads nor replaces the table.
func (s *slotRing) writeStatus(ctx context.Context) error {
	cfg := s.config()
	ring := &v1alpha1.ControllerRing{}
	if err := s.c.client.Get(ctx, types.NamespacedName{Name: s.name}, ring); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("getting ring: %w", err)
	}
	if ring.UID != cfg.uid || !ring.DeletionTimestamp.IsZero() {
		return nil
	}
	status := s.computeStatus(ring, cfg)
	if equality.Semantic.DeepEqual(&ring.Status, status) {
		return nil
	}
	updated := ring.DeepCopy()
	updated.Status = *status
	opts := []client.SubResourcePatchOption{}
	if s.c.opts.FieldManager != "" {
		opts = append(opts, client.FieldOwner(s.c.opts.FieldManager))
	}
	// status.slots is the same in ring and updated: the patch leaves it out.
	if err := s.c.client.Status().Patch(ctx, updated, client.MergeFrom(ring), opts...); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patching ring status: %w", err)
	}
	eventReadyChange(s.c, ring, meta.FindStatusCondition(ring.Status.Conditions, v1alpha1.ConditionReady),
		meta.FindStatusCondition(status.Conditions, v1alpha1.ConditionReady))
	return nil
}

// computeStatus builds the ring's status (its slot table as it is) and
// updates the ring's gauges.
func (s *slotRing) computeStatus(ring *v1alpha1.ControllerRing, cfg *ringConfig) *v1alpha1.ControllerRingStatus {
	status := ring.Status.DeepCopy()
	status.ObservedGeneration = cfg.generation
	status.Objects, status.Drains = 0, 0
	status.UnassignedObjects = 0
	if s.labeler.HasSynced() {
		status.UnassignedObjects = int32(s.labeler.Unlabelled()) //nolint:gosec // bounded by the objects in memory
	}

	granted := grantedSlots(ring)
	members := s.c.opts.Registry.Members(s.name)
	byState := setMembers(status, members, cfg.virtualNodes, func(ms *v1alpha1.MemberStatus) { ms.Slots = granted[ms.Name] })
	meta.SetStatusCondition(&status.Conditions, s.readyCondition(cfg, status))

	for _, st := range membership.States {
		metrics.Instances.WithLabelValues(s.name, string(st)).Set(float64(byState[st]))
	}
	metrics.UnassignedObjects.WithLabelValues(s.name).Set(float64(status.UnassignedObjects))
	return status
}

// grantedSlots counts the slots the ring's table grants each instance;
// empty when the ring has no valid table.
func grantedSlots(ring *v1alpha1.ControllerRing) map[string]int32 {
	out := map[string]int32{}
	table, err := slots.FromStatus(ring.Spec.EffectiveSlotCount(), ring.Status.Slots)
	if err != nil {
		return out
	}
	for _, sl := range table.Slots {
		if sl.Holder != "" && !sl.Releasing {
			out[sl.Holder]++
		}
	}
	return out
}

func (s *slotRing) readyCondition(cfg *ringConfig, status *v1alpha1.ControllerRingStatus) metav1.Condition {
	return readyCondition(s.name, cfg, s.labeler.Problems(), s.labeler.HasSynced(), status.AvailableInstances, slotWords)
}
