package slotcache

import (
	"context"
	"strconv"
	"sync"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/slots"
)

// batch is one LIST per ring kind and form of the slots of every group
// cache a SetSlots starts at once, shared out among those groups' informers
// as their first list: each group then watches from the batch's
// resourceVersion with its own selector, as if it had listed itself.
//
// The API server's watch cache answers a LIST with a label selector by
// filtering every object of the resource: about a second per list at a
// million objects on two cores, whatever the few thousand objects it
// returns. An instance granted slots in many groups at once (a new
// instance of a big ring is granted its share in up to 64 groups) would
// list the resource that many times; the batch lists it once.
//
// Only kinds selected by the slot label, watched in all namespaces or in
// one, without selectors of their own per namespace, are listed in a batch;
// the others' groups list themselves. A batch that failed, or is closed,
// leaves the groups to list themselves too.
type batch struct {
	c        *Cache
	selector labels.Selector // the slots of every group of the batch
	mu       sync.Mutex
	closed   bool
	lists    map[informerKey]*batchList
}

// batchList is a batch's list of one kind and form.
type batchList struct {
	once    sync.Once
	byGroup map[int][]runtime.Object
	rv      string
	err     error
}

// newBatch returns a batch of the slots of groups, or nil when fewer than
// two groups start (nothing to share).
func (c *Cache) newBatch(groups []*group) *batch {
	if len(groups) < 2 {
		return nil
	}
	var values []string
	for _, g := range groups {
		for _, s := range g.slots {
			values = append(values, strconv.Itoa(s))
		}
	}
	req, err := labels.NewRequirement(c.label, selection.In, values)
	if err != nil {
		return nil
	}
	return &batch{c: c, selector: labels.NewSelector().Add(*req), lists: map[informerKey]*batchList{}}
}

// close ends the batch: groups that did not take their part list
// themselves, and the objects not taken are let go.
func (b *batch) close() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.lists = nil
}

// take returns g's part of the batch's list of key, listing it first when
// no group did yet: a list of key's type holding the objects of g's slots,
// at the batch's resourceVersion. ok is false when the kind is not listed
// in batches, the list failed, or the batch is closed: g then lists itself.
// Each group's part is taken once; the first list of an informer only asks.
func (b *batch) take(ctx context.Context, key informerKey, g *group) (runtime.Object, bool) {
	if b == nil {
		return nil, false
	}
	opts, ok := b.c.batchOptions(key, b.selector)
	if !ok {
		return nil, false
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, false
	}
	bl := b.lists[key]
	if bl == nil {
		bl = &batchList{}
		b.lists[key] = bl
	}
	b.mu.Unlock()
	bl.once.Do(func() { bl.byGroup, bl.rv, bl.err = b.c.listBatch(ctx, key, opts) })
	if bl.err != nil {
		return nil, false
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, false
	}
	items := bl.byGroup[g.num]
	delete(bl.byGroup, g.num)
	b.mu.Unlock()
	list, err := b.c.list(key)
	if err != nil {
		return nil, false
	}
	if err := apimeta.SetList(list, items); err != nil {
		return nil, false
	}
	list.SetResourceVersion(bl.rv)
	return list, true
}

// batchOptions returns the options of a batch's list of key's kind with
// slots selecting the batch's slots, as a group cache's informer would list
// it, and false when the kind is not listed in batches.
func (c *Cache) batchOptions(key informerKey, slotSelector labels.Selector) (*client.ListOptions, bool) {
	gk := key.gvk.GroupKind()
	rk, ring := c.ring[gk]
	if !ring || rk.sharded {
		return nil, false
	}
	byObject := c.baseByObject(gk)
	opts := &client.ListOptions{
		LabelSelector: and(byObject.Label, c.base.DefaultLabelSelector, slotSelector),
		FieldSelector: byObject.Field,
		// No resourceVersion: a consistent read, as a group informer's
		// first list (listThenWatch.ListWithContext).
	}
	if opts.FieldSelector == nil {
		opts.FieldSelector = c.base.DefaultFieldSelector
	}
	if rk.namespaced {
		namespaces := byObject.Namespaces
		if namespaces == nil {
			namespaces = c.base.DefaultNamespaces
		}
		switch len(namespaces) {
		case 0:
		case 1:
			for ns, cfg := range namespaces {
				if cfg.LabelSelector != nil || cfg.FieldSelector != nil {
					return nil, false
				}
				if ns != cache.AllNamespaces {
					opts.Namespace = ns
				}
			}
		default:
			return nil, false
		}
	}
	return opts, true
}

// listBatch lists key's objects with opts and sorts them by group.
func (c *Cache) listBatch(ctx context.Context, key informerKey, opts *client.ListOptions) (map[int][]runtime.Object, string, error) {
	list, err := c.list(key)
	if err != nil {
		return nil, "", err
	}
	if err := c.lister.List(ctx, list, opts); err != nil {
		return nil, "", err
	}
	// Each item in its own allocation, as client-go's reflector takes a
	// list: an object kept in a store must not pin the whole list.
	items, err := apimeta.ExtractListWithAlloc(list)
	if err != nil {
		return nil, "", err
	}
	byGroup := map[int][]runtime.Object{}
	gk := key.gvk.GroupKind()
	for _, item := range items {
		obj, ok := item.(client.Object)
		if !ok {
			continue
		}
		if key.form == metadataForm {
			obj.GetObjectKind().SetGroupVersionKind(key.gvk)
		}
		slot, ok := c.SlotOf(gk, obj)
		if !ok {
			continue
		}
		g := slots.Group(slot, c.count)
		byGroup[g] = append(byGroup[g], obj)
	}
	return byGroup, list.GetResourceVersion(), nil
}
