package slotcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// Form of the objects of an informer: typed, unstructured or metadata only.
type form int

const (
	structured form = iota
	unstructuredForm
	metadataForm
)

// informerKey names the informers of a kind and form.
type informerKey struct {
	gvk  schema.GroupVersionKind
	form form
}

// classify returns the informer key of obj (an object or a list) and
// whether it is a ring kind.
func (c *Cache) classify(obj runtime.Object) (informerKey, bool, error) {
	gvk, err := apiutil.GVKForObject(obj, c.base.Scheme)
	if err != nil {
		return informerKey{}, false, err
	}
	key := informerKey{gvk: gvk}
	switch obj.(type) {
	case *unstructured.Unstructured, *unstructured.UnstructuredList:
		key.form = unstructuredForm
	case *metav1.PartialObjectMetadata, *metav1.PartialObjectMetadataList:
		key.form = metadataForm
	}
	if apimeta.IsListType(obj) {
		key.gvk.Kind = strings.TrimSuffix(key.gvk.Kind, "List")
	}
	_, ring := c.ring[key.gvk.GroupKind()]
	return key, ring, nil
}

// object returns an empty object of key.
func (c *Cache) object(key informerKey) (client.Object, error) {
	switch key.form {
	case unstructuredForm:
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(key.gvk)
		return u, nil
	case metadataForm:
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(key.gvk)
		return m, nil
	}
	o, err := c.base.Scheme.New(key.gvk)
	if err != nil {
		return nil, err
	}
	obj, ok := o.(client.Object)
	if !ok {
		return nil, fmt.Errorf("slotcache: %s is not an object", key.gvk)
	}
	return obj, nil
}

// list returns an empty list of key's objects.
func (c *Cache) list(key informerKey) (client.ObjectList, error) {
	gvk := key.gvk
	gvk.Kind += "List"
	switch key.form {
	case unstructuredForm:
		u := &unstructured.UnstructuredList{}
		u.SetGroupVersionKind(gvk)
		return u, nil
	case metadataForm:
		m := &metav1.PartialObjectMetadataList{}
		m.SetGroupVersionKind(gvk)
		return m, nil
	}
	o, err := c.base.Scheme.New(gvk)
	if err != nil {
		return nil, err
	}
	l, ok := o.(client.ObjectList)
	if !ok {
		return nil, fmt.Errorf("slotcache: %s is not a list", gvk)
	}
	return l, nil
}

// fanFor returns the informer of key across the groups, creating it and
// the informers of every live group cache when needed.
func (c *Cache) fanFor(key informerKey) (*fan, error) {
	c.mu.RLock()
	f := c.fans[key]
	c.mu.RUnlock()
	if f != nil {
		return f, nil
	}
	obj, err := c.object(key)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.fans[key]; f != nil {
		return f, nil
	}
	f = newFan(c, key, obj)
	for g := range c.live {
		if err := f.attach(g); err != nil {
			return nil, err
		}
	}
	c.fans[key] = f
	return f, nil
}

// Get reads an object. An object of a ring kind is looked up in each
// serving group's cache (its group is known from its slot label only once
// it is read); it is not found when no group holds it, whether it does not
// exist or belongs to a slot the instance does not hold (or no longer
// shows: see the package documentation).
func (c *Cache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	ik, ring, err := c.classify(obj)
	if err != nil {
		return err
	}
	if !ring {
		return c.plain.Get(ctx, key, obj, opts...)
	}
	groups, started := c.serving()
	if !started {
		return &cache.ErrCacheNotStarted{}
	}
	if _, err := c.fanFor(ik); err != nil {
		return err
	}
	for _, g := range groups {
		err := g.cache.Get(ctx, key, obj, opts...)
		if err == nil || !apierrors.IsNotFound(err) {
			return err
		}
	}
	resource := ik.gvk.Kind
	if m, err := c.base.Mapper.RESTMapping(ik.gvk.GroupKind(), ik.gvk.Version); err == nil {
		resource = m.Resource.Resource
	}
	return apierrors.NewNotFound(schema.GroupResource{Group: ik.gvk.Group, Resource: resource}, key.Name)
}

// List lists objects. Objects of a ring kind are listed from every serving
// group's cache with the options given (namespace, label and field
// selectors, limit) and merged, by ascending group. Continue is not
// supported.
func (c *Cache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	ik, ring, err := c.classify(list)
	if err != nil {
		return err
	}
	if !ring {
		return c.plain.List(ctx, list, opts...)
	}
	listOpts := client.ListOptions{}
	listOpts.ApplyOptions(opts)
	if listOpts.Continue != "" {
		return errors.New("slotcache: the continue list option is not supported by the cache")
	}
	groups, started := c.serving()
	if !started {
		return &cache.ErrCacheNotStarted{}
	}
	if _, err := c.fanFor(ik); err != nil {
		return err
	}
	var items []runtime.Object
	resourceVersion := ""
	for _, g := range groups {
		part, ok := list.DeepCopyObject().(client.ObjectList)
		if !ok {
			return fmt.Errorf("slotcache: %T is not a list", list)
		}
		if err := g.cache.List(ctx, part, &listOpts); err != nil {
			return err
		}
		got, err := apimeta.ExtractList(part)
		if err != nil {
			return err
		}
		items = append(items, got...)
		resourceVersion = part.GetResourceVersion()
		if listOpts.Limit > 0 {
			listOpts.Limit -= int64(len(got))
			if listOpts.Limit <= 0 {
				break
			}
		}
	}
	if err := apimeta.SetList(list, items); err != nil {
		return err
	}
	list.SetResourceVersion(resourceVersion)
	list.SetContinue("")
	return nil
}

// GetInformer returns the informer of obj's kind. For a ring kind it spans
// the serving group caches and keeps delivering events across group
// changes (see the package documentation); unless BlockUntilSynced(false)
// is given it waits for the serving groups' informers to sync once the
// cache started.
func (c *Cache) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	key, ring, err := c.classify(obj)
	if err != nil {
		return nil, err
	}
	if !ring {
		return c.plain.GetInformer(ctx, obj, opts...)
	}
	return c.ringInformer(ctx, key, opts)
}

// GetInformerForKind is GetInformer for a kind given by its
// GroupVersionKind (typed objects).
func (c *Cache) GetInformerForKind(ctx context.Context, gvk schema.GroupVersionKind, opts ...cache.InformerGetOption) (cache.Informer, error) {
	if _, ring := c.ring[gvk.GroupKind()]; !ring {
		return c.plain.GetInformerForKind(ctx, gvk, opts...)
	}
	return c.ringInformer(ctx, informerKey{gvk: gvk}, opts)
}

func (c *Cache) ringInformer(ctx context.Context, key informerKey, opts []cache.InformerGetOption) (cache.Informer, error) {
	f, err := c.fanFor(key)
	if err != nil {
		return nil, err
	}
	var getOpts cache.InformerGetOptions
	for _, o := range opts {
		o(&getOpts)
	}
	groups, started := c.serving()
	if started && (getOpts.BlockUntilSynced == nil || *getOpts.BlockUntilSynced) {
		for _, g := range groups {
			if _, err := g.cache.GetInformer(ctx, f.obj, opts...); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// RemoveInformer removes the informer of a kind that is not the ring's.
// The informers of the ring's kinds are the groups' watches and cannot be
// removed.
func (c *Cache) RemoveInformer(ctx context.Context, obj client.Object) error {
	key, ring, err := c.classify(obj)
	if err != nil {
		return err
	}
	if ring {
		return fmt.Errorf("slotcache: the informer of ring resource %s cannot be removed", key.gvk.GroupKind())
	}
	return c.plain.RemoveInformer(ctx, obj)
}

// IndexField adds a field index. An index of a ring kind is added to every
// group cache, present and future.
func (c *Cache) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	_, ring, err := c.classify(obj)
	if err != nil {
		return err
	}
	if !ring {
		return c.plain.IndexField(ctx, obj, field, extract)
	}
	c.mu.Lock()
	proto, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		c.mu.Unlock()
		return fmt.Errorf("slotcache: %T is not an object", obj)
	}
	c.indexes = append(c.indexes, index{obj: proto, field: field, extract: extract})
	groups := slices.Collect(maps.Keys(c.live))
	c.mu.Unlock()
	sort.Slice(groups, func(i, j int) bool { return groups[i].num < groups[j].num })
	for _, g := range groups {
		if err := g.cache.IndexField(ctx, obj, field, extract); err != nil {
			return fmt.Errorf("slotcache: index %s of %s: %w", field, g, err)
		}
	}
	return nil
}
