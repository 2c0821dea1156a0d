package leaseholder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// watch starts watching the Lease by name, when the client can watch, so
// that a Lease deleted, taken, or moved out of the ring is noticed without
// waiting for the next renewal. The watch only wakes the renewal loop, which
// checks with the Reader: a watch may deliver a version older than the one
// this holder wrote.
func (h *Holder) watch(ctx context.Context) {
	w, ok := h.client.(client.WithWatch)
	if !ok {
		return
	}
	byName := fields.OneTermEqualSelector("metadata.name", h.opts.Identity)
	listOptions := func(raw metav1.ListOptions) *client.ListOptions {
		return &client.ListOptions{Namespace: h.opts.Namespace, FieldSelector: byName, Raw: &raw}
	}
	suspicious := func(obj any) {
		l, ok := obj.(*coordinationv1.Lease)
		if ok && ptr.Deref(l.Spec.HolderIdentity, "") == h.opts.Identity {
			h.proof.seen(l.Spec.RenewTime)
		}
		if !ok || l.Labels[v1alpha1.LabelRing] != h.opts.Ring || ptr.Deref(l.Spec.HolderIdentity, "") != h.opts.Identity {
			h.wake()
		}
	}
	_, informer := toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, raw metav1.ListOptions) (runtime.Object, error) {
				list := &coordinationv1.LeaseList{}
				return list, w.List(ctx, list, listOptions(raw))
			},
			WatchFuncWithContext: func(ctx context.Context, raw metav1.ListOptions) (watch.Interface, error) {
				return w.Watch(ctx, &coordinationv1.LeaseList{}, listOptions(raw))
			},
		},
		ObjectType: &coordinationv1.Lease{},
		Handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { suspicious(obj) },
			UpdateFunc: func(_, obj any) { suspicious(obj) },
			DeleteFunc: func(any) { h.wake() },
		},
	})
	go informer.RunWithContext(ctx)
}

// watchProof pairs the writes a holder sent with what its watch delivered
// (Holder.WatchedAt). It is safe for concurrent use.
type watchProof struct {
	mu sync.Mutex
	// sent holds the renewTime of each write sent and not yet seen, oldest
	// first; that stamp is also when it was sent (Clock).
	sent []metav1.MicroTime
	// at is when the newest write seen through the watch was sent.
	at time.Time
}

// maxSent bounds watchProof.sent; older writes are forgotten first.
const maxSent = 16

// sending records a write about to be sent, stamped renewTime.
func (p *watchProof) sending(renewTime *metav1.MicroTime) {
	if renewTime == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sent) == maxSent {
		p.sent = slices.Delete(p.sent, 0, 1)
	}
	p.sent = append(p.sent, *renewTime)
}

// seen records a version of the Lease the watch delivered, held by this
// holder's identity and stamped renewTime: when it is one of the writes
// sent, the watch has caught up with it and every older one.
func (p *watchProof) seen(renewTime *metav1.MicroTime) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.sent {
		if microEqual(&p.sent[i], renewTime) {
			if at := p.sent[i].Time; at.After(p.at) {
				p.at = at
			}
			p.sent = slices.Delete(p.sent, 0, i+1)
			return
		}
	}
}

func (p *watchProof) watchedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.at
}

// wake asks the renewal loop to check the Lease now.
func (h *Holder) wake() {
	select {
	case h.woken <- struct{}{}:
	default: // a check is pending already
	}
}

// waitWatching waits for d, checking the Lease whenever the watch wakes
// it. It returns true once d has passed or Annotate asked for a renewal now
// (its request), false when ctx ended first (nil) or the check found the
// Lease lost (an error wrapping ErrLeaseLost).
func (h *Holder) waitWatching(ctx context.Context, d time.Duration) (bool, *annotation, error) {
	t := h.opts.Clock.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, nil, nil
		case <-t.C():
			return true, nil, nil
		case req := <-h.annotations:
			return true, req, nil
		case <-h.woken:
			if err := h.check(ctx); errors.Is(err, ErrLeaseLost) {
				return false, nil, err
			}
		}
	}
}

// check reads the Lease and reports it lost when it is gone, taken, or no
// longer in the ring. Other errors are left to the next renewal.
func (h *Holder) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.opts.RenewPeriod)
	defer cancel()
	current := &coordinationv1.Lease{}
	if err := h.opts.Reader.Get(ctx, h.key(), current); err != nil {
		if apierrors.IsNotFound(err) {
			return errDeleted
		}
		h.log.V(1).Info("Could not check the instance Lease", "error", err.Error())
		return err
	}
	if err := h.leftRing(current); err != nil {
		return err
	}
	if !h.ours(current) {
		return fmt.Errorf("%w: now held by %q", ErrLeaseLost, ptr.Deref(current.Spec.HolderIdentity, ""))
	}
	return nil
}

// leftRing returns an error wrapping ErrLeaseLost when current no longer
// carries this holder's ring label: removed or changed, the Lease is no
// longer a member of the ring, as if it were deleted.
func (h *Holder) leftRing(current *coordinationv1.Lease) error {
	if ring, ok := current.Labels[v1alpha1.LabelRing]; !ok || ring != h.opts.Ring {
		return fmt.Errorf("%w: the Lease left ring %q (label %s=%q)", ErrLeaseLost, h.opts.Ring, v1alpha1.LabelRing, ring)
	}
	return nil
}
