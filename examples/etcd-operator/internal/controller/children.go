package controller

import (
	"context"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// childError is a failure to bring a child to its desired state that
// retrying alone will not fix: the object belongs to someone else, or the
// API server refuses it. It puts the cluster into Failed with Reason.
type childError struct {
	Reason string
	Err    error
}

func (e *childError) Error() string { return e.Err.Error() }
func (e *childError) Unwrap() error { return e.Err }

// classify turns an API error into a childError when it is one retrying
// will not cure, and returns other errors unchanged.
func classify(err error) error {
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err) {
		return &childError{Reason: etcdv1alpha1.ReasonResourceRejected, Err: err}
	}
	return err
}

// child is one desired object of a cluster and how to bring an existing
// object of the same name to it.
type child struct {
	desired client.Object
	// update copies the desired state into existing, keeping what the API
	// server or other controllers own, and reports whether anything changed.
	update func(existing client.Object) bool
}

// children returns the desired children of c in the order they are made:
// configuration first, Services before the StatefulSet that names them.
// replicas is the StatefulSet's replica count (see nextReplicas).
func (r *Reconciler) children(c *etcdv1alpha1.EtcdCluster, replicas int32) []child {
	s := spec(c)
	cm := buildConfigMap(c, s)
	peer := buildPeerService(c, s)
	clientSvc := buildClientService(c, s)
	sts := withRestore(c, buildStatefulSet(c, s, hashData(cm.Data), replicas))
	pdb := buildPDB(c, s)
	return []child{
		{desired: cm, update: func(o client.Object) bool {
			e := o.(*corev1.ConfigMap)
			if equality.Semantic.DeepEqual(e.Data, cm.Data) {
				return false
			}
			e.Data = cm.Data
			return true
		}},
		{desired: peer, update: func(o client.Object) bool { return updateService(o.(*corev1.Service), peer) }},
		{desired: clientSvc, update: func(o client.Object) bool { return updateService(o.(*corev1.Service), clientSvc) }},
		{desired: sts, update: func(o client.Object) bool {
			e := o.(*appsv1.StatefulSet)
			// Keep template annotations others set (kubectl rollout restart
			// writes one): dropping them would restart every member.
			for k, v := range e.Spec.Template.Annotations {
				if _, ours := sts.Spec.Template.Annotations[k]; !ours {
					sts.Spec.Template.Annotations[k] = v
				}
			}
			// Selector, service name, pod management policy and volume
			// claims are immutable; the schema keeps storage unchanged.
			if equality.Semantic.DeepDerivative(sts.Spec.Replicas, e.Spec.Replicas) &&
				equality.Semantic.DeepDerivative(sts.Spec.Template, e.Spec.Template) &&
				equality.Semantic.DeepDerivative(sts.Spec.UpdateStrategy, e.Spec.UpdateStrategy) {
				return false
			}
			e.Spec.Replicas = sts.Spec.Replicas
			e.Spec.Template = sts.Spec.Template
			e.Spec.UpdateStrategy = sts.Spec.UpdateStrategy
			return true
		}},
		{desired: pdb, update: func(o client.Object) bool {
			e := o.(*policyv1.PodDisruptionBudget)
			if equality.Semantic.DeepDerivative(pdb.Spec, e.Spec) {
				return false
			}
			e.Spec.MinAvailable = pdb.Spec.MinAvailable
			e.Spec.MaxUnavailable = nil
			e.Spec.Selector = pdb.Spec.Selector
			return true
		}},
	}
}

// updateService brings e to desired, keeping the cluster IPs and the node
// ports the API server allocated.
func updateService(e, desired *corev1.Service) bool {
	want := desired.Spec.DeepCopy()
	keepNodePorts := want.Type == corev1.ServiceTypeNodePort || want.Type == corev1.ServiceTypeLoadBalancer
	for i := range want.Ports {
		for _, p := range e.Spec.Ports {
			if keepNodePorts && p.Name == want.Ports[i].Name {
				want.Ports[i].NodePort = p.NodePort
			}
		}
	}
	if e.Spec.Type == want.Type && e.Spec.PublishNotReadyAddresses == want.PublishNotReadyAddresses &&
		equality.Semantic.DeepEqual(e.Spec.Selector, want.Selector) &&
		equality.Semantic.DeepDerivative(want.Ports, e.Spec.Ports) && len(want.Ports) == len(e.Spec.Ports) {
		return false
	}
	e.Spec.Type = want.Type
	e.Spec.Selector = want.Selector
	e.Spec.Ports = want.Ports
	e.Spec.PublishNotReadyAddresses = want.PublishNotReadyAddresses
	return true
}

// ensure creates ch's object or brings the existing one to the desired
// state. It returns a *childError for what retrying will not fix.
func (r *Reconciler) ensure(ctx context.Context, c *etcdv1alpha1.EtcdCluster, ch child) error {
	desired := ch.desired
	kind := kindOf(desired)
	key := client.ObjectKeyFromObject(desired)
	if err := controllerutil.SetControllerReference(c, desired, r.scheme); err != nil {
		return fmt.Errorf("setting the owner of %s %s: %w", kind, key, err)
	}
	existing := desired.DeepCopyObject().(client.Object)
	err := r.client.Get(ctx, key, existing)
	switch {
	case apierrors.IsNotFound(err):
		r.opts.LabelChild(c, desired)
		if err := r.client.Create(ctx, desired); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return r.explainHidden(ctx, c, desired)
			}
			return classify(fmt.Errorf("creating %s %s: %w", kind, key, err))
		}
		log.FromContext(ctx).V(1).Info("Created child", "kind", kind, "name", key.Name)
		r.event(c, corev1.EventTypeNormal, "Created", "Create", "Created %s %s", kind, key.Name)
		return nil
	case err != nil:
		return fmt.Errorf("reading %s %s: %w", kind, key, err)
	}

	if err := checkControlled(c, existing, kind); err != nil {
		return err
	}
	original := existing.DeepCopyObject().(client.Object)
	changed := mergeLabels(existing, desired.GetLabels())
	if ch.update(existing) {
		changed = true
	}
	if !changed {
		return nil
	}
	// The optimistic lock makes a write based on a stale cache fail rather
	// than undo someone else's newer change; the retry reads again.
	patch := client.MergeFromWithOptions(original, client.MergeFromWithOptimisticLock{})
	if err := r.client.Patch(ctx, existing, patch); err != nil {
		return classify(fmt.Errorf("updating %s %s: %w", kind, key, err))
	}
	log.FromContext(ctx).V(1).Info("Updated child", "kind", kind, "name", key.Name)
	r.event(c, corev1.EventTypeNormal, "Updated", "Update", "Updated %s %s to the cluster's spec", kind, key.Name)
	return nil
}

// explainHidden handles a child that exists although the cache does not
// hold it. Read directly: an object of someone else is a conflict the user
// must resolve. Our own object carries labels that keep it out of this
// instance's cache: normally the sharder is about to relabel it with its
// owner, but a child of a resource the ring does not list is never
// relabelled, so the reconciler gives it its owner's labels itself. The
// value is the one the sharder would write (the owner's instance); where
// the sharder's webhook protects the label, the patch is refused and the
// sharder's own relabelling is awaited. Either way the caller retries.
func (r *Reconciler) explainHidden(ctx context.Context, c *etcdv1alpha1.EtcdCluster, desired client.Object) error {
	kind := kindOf(desired)
	key := client.ObjectKeyFromObject(desired)
	existing := desired.DeepCopyObject().(client.Object)
	if err := r.opts.APIReader.Get(ctx, key, existing); err != nil {
		return fmt.Errorf("reading %s %s, which exists but is not in the cache: %w", kind, key, err)
	}
	if err := checkControlled(c, existing, kind); err != nil {
		return err
	}
	relabelled := existing.DeepCopyObject().(client.Object)
	r.opts.LabelChild(c, relabelled)
	if equality.Semantic.DeepEqual(relabelled.GetLabels(), existing.GetLabels()) {
		return fmt.Errorf("%s %s exists but is not in this instance's cache yet", kind, key)
	}
	patch := client.MergeFromWithOptions(existing, client.MergeFromWithOptimisticLock{})
	if err := r.client.Patch(ctx, relabelled, patch); err != nil {
		return fmt.Errorf("%s %s is not in this instance's cache and giving it its owner's labels failed: %w", kind, key, err)
	}
	log.FromContext(ctx).Info("Gave a child its owner's labels", "kind", kind, "name", key.Name)
	return fmt.Errorf("%s %s was given its owner's labels and is not in this instance's cache yet", kind, key)
}

// checkControlled returns a ResourceConflict childError unless obj is
// controlled by c.
func checkControlled(c *etcdv1alpha1.EtcdCluster, obj client.Object, kind string) error {
	ref := metav1.GetControllerOf(obj)
	if ref != nil && ref.UID == c.UID {
		return nil
	}
	owner := "no controller"
	if ref != nil {
		owner = fmt.Sprintf("controller %s %s", ref.Kind, ref.Name)
	}
	return &childError{
		Reason: etcdv1alpha1.ReasonResourceConflict,
		Err: fmt.Errorf("%s %s/%s already exists with %s: delete or rename it so the cluster can own it",
			kind, obj.GetNamespace(), obj.GetName(), owner),
	}
}

// mergeLabels adds want to obj's labels and reports whether any changed.
// Labels obj has beyond want (the shard and drain labels among them) stay.
func mergeLabels(obj client.Object, want map[string]string) bool {
	labels := obj.GetLabels()
	changed := false
	for k, v := range want {
		if cur, ok := labels[k]; !ok || cur != v {
			if labels == nil {
				labels = map[string]string{}
			}
			labels[k] = v
			changed = true
		}
	}
	obj.SetLabels(labels)
	return changed
}

// deleteChildren deletes every child of c this instance can see and
// returns how many still exist. An object is deleted only while it is the
// one c controls (UID precondition), never a namesake created since.
func (r *Reconciler) deleteChildren(ctx context.Context, c *etcdv1alpha1.EtcdCluster) (int, error) {
	remaining := 0
	var errs []error
	children, secrets := r.children(c, 0), secretObjects(c)
	objs := make([]client.Object, 0, len(children)+len(secrets))
	for _, ch := range children {
		objs = append(objs, ch.desired.DeepCopyObject().(client.Object))
	}
	for _, s := range secrets {
		objs = append(objs, s)
	}
	for _, obj := range objs {
		kind := kindOf(obj)
		key := client.ObjectKeyFromObject(obj)
		if err := r.client.Get(ctx, key, obj); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("reading %s %s: %w", kind, key, err))
			}
			continue
		}
		if ref := metav1.GetControllerOf(obj); ref == nil || ref.UID != c.UID {
			continue
		}
		remaining++
		if obj.GetDeletionTimestamp() != nil {
			continue
		}
		uid := obj.GetUID()
		err := r.client.Delete(ctx, obj, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			remaining-- // gone, or replaced by an object that is not ours
		case err != nil:
			errs = append(errs, fmt.Errorf("deleting %s %s: %w", kind, key, err))
		default:
			r.event(c, corev1.EventTypeNormal, "Deleted", "Delete", "Deleted %s %s", kind, key.Name)
		}
	}
	return remaining, errors.Join(errs...)
}

// kindOf names the kind of one of the children's types.
func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *corev1.ConfigMap:
		return "ConfigMap"
	case *corev1.Service:
		return "Service"
	case *appsv1.StatefulSet:
		return "StatefulSet"
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	case *corev1.Secret:
		return "Secret"
	}
	return fmt.Sprintf("%T", obj)
}
