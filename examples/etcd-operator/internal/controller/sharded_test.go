package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// startSharder runs the sharder's lease and assignment controllers, as
// `sharder run` does on its leader.
func startSharder(t *testing.T) {
	t.Helper()
	mgrOpts := env().ManagerOptions()
	mgrOpts.Cache = cache.Options{ByObject: leasecontroller.CacheByObject()}
	mgr := env().NewManager(t, nil, mgrOpts)
	registry := leasecontroller.NewRegistry()
	lc, err := leasecontroller.New(leasecontroller.Options{Registry: registry})
	if err != nil {
		t.Fatalf("creating lease controller: %v", err)
	}
	if err := lc.SetupWithManager(mgr); err != nil {
		t.Fatalf("setting up lease controller: %v", err)
	}
	a, err := assign.New(assign.Options{Registry: registry, EventRecorder: &record.FakeRecorder{}})
	if err != nil {
		t.Fatalf("creating assignment controller: %v", err)
	}
	if err := a.SetupWithManager(mgr); err != nil {
		t.Fatalf("setting up assignment controller: %v", err)
	}
	testenv.StartManager(t, mgr)
}

// startInstance runs one instance of the operator in ring, wired as its
// main does: label-selected cache, Lease, wrapped reconciler, child labels.
func startInstance(t *testing.T, ring, ns, id string, endpoints func(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string) (stop func()) {
	t.Helper()
	instOpts := instance.Options{
		Ring:        ring,
		Identity:    id,
		RetryPeriod: 100 * time.Millisecond,
		Lease: leaseholder.Options{
			Namespace: ns,
			// Long enough that a loaded machine does not cost an instance
			// its Lease: instances here stop only gracefully, releasing it.
			LeaseDuration: 15 * time.Second,
			RenewPeriod:   time.Second,
			OnLost:        func() { t.Errorf("instance %s lost its Lease", id) },
		},
	}
	mgrOpts := env().ManagerOptions()
	mgrOpts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}
	mgrOpts.NewCache = instance.NewCache(instOpts,
		&etcdv1alpha1.EtcdCluster{}, &corev1.ConfigMap{}, &corev1.Service{},
		&appsv1.StatefulSet{}, &policyv1.PodDisruptionBudget{}, &corev1.Pod{})
	mgr := env().NewManager(t, nil, mgrOpts)
	inst, err := instance.Setup(mgr, instOpts)
	if err != nil {
		t.Fatalf("setting up instance %s: %v", id, err)
	}
	r := controller.NewReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("etcd-operator"), controller.Options{
		LabelChild:        func(owner, child client.Object) { inst.LabelChild(owner, child) },
		APIReader:         mgr.GetAPIReader(),
		RecoveryInterval:  200 * time.Millisecond,
		Endpoints:         endpoints,
		EtcdTimeout:       2 * time.Second,
		EtcdCheckInterval: 500 * time.Millisecond,
		Wrap: func(next reconcile.Reconciler) (reconcile.Reconciler, error) {
			return inst.Wrap(&etcdv1alpha1.EtcdCluster{}, next)
		},
	})
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatalf("setting up controller of %s: %v", id, err)
	}
	return testenv.StartManager(t, mgr)
}

// newEtcdRing declares the operator's ring for the objects of namespace ns.
func newEtcdRing(t *testing.T, ns string) string {
	t.Helper()
	ring := &sharderv1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: sharderv1alpha1.ControllerRingSpec{
			LeaseNamespace: ns,
			Resources: []sharderv1alpha1.RingResource{{
				Group:    etcdv1alpha1.GroupVersion.Group,
				Resource: "etcdclusters",
				ControlledResources: []metav1.GroupResource{
					{Group: "", Resource: "configmaps"},
					{Group: "", Resource: "services"},
					{Group: "apps", Resource: "statefulsets"},
					{Group: "policy", Resource: "poddisruptionbudgets"},
					{Group: "", Resource: "pods"},
				},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{sharderv1alpha1.LabelNamespaceName: ns}},
			DrainTimeout:      &metav1.Duration{Duration: 10 * time.Second},
		},
	}
	g := NewWithT(t)
	g.Expect(env().Client.Create(context.Background(), ring)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), ring) })
	return ring.Name
}

// expectColocated asserts, eventually, that every EtcdCluster of ns is
// assigned to one of ids, and that each of its children (and member pods
// that exist) carries the same shard label.
func expectColocated(ctx context.Context, g Gomega, ns, ring string, ids []string, clusters []*etcdv1alpha1.EtcdCluster) map[string]string {
	shard := sharderv1alpha1.ShardLabel(ring)
	assigned := map[string]string{}
	g.Eventually(func(g Gomega) {
		for _, c := range clusters {
			got := &etcdv1alpha1.EtcdCluster{}
			g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(c), got)).To(Succeed())
			owner := got.Labels[shard]
			g.Expect(ids).To(ContainElement(owner), "cluster %s is not assigned", c.Name)
			g.Expect(got.Finalizers).To(ContainElement(controller.Finalizer), "cluster %s was not reconciled", c.Name)
			for _, obj := range objectsOf(got) {
				g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
				g.Expect(obj.GetLabels()).To(HaveKeyWithValue(shard, owner), "%T %s is not with its cluster", obj, obj.GetName())
			}
			pods := &corev1.PodList{}
			g.Expect(env().Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{controller.LabelCluster: c.Name})).To(Succeed())
			for _, p := range pods.Items {
				g.Expect(p.Labels).To(HaveKeyWithValue(shard, owner), "pod %s is not with its cluster", p.Name)
			}
			assigned[c.Name] = owner
		}
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	return assigned
}

// createMemberPod plays the StatefulSet controller: a pod controlled by the
// cluster's StatefulSet, created without any shard label.
func createMemberPod(ctx context.Context, g Gomega, c *etcdv1alpha1.EtcdCluster, ordinal int) {
	sts := &appsv1.StatefulSet{}
	g.Eventually(func() error {
		return env().Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, sts)
	}, timeout, interval).Should(Succeed())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   c.Namespace,
			Name:        fmt.Sprintf("%s-%d", c.Name, ordinal),
			Labels:      sts.Spec.Template.Labels,
			Annotations: sts.Spec.Template.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr.To(true),
			}},
		},
		// A member that started: no membership gate; the volume claim
		// template's volume as an emptyDir.
		Spec: corev1.PodSpec{Containers: sts.Spec.Template.Spec.Containers, Volumes: []corev1.Volume{{
			Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
		}}},
	}
	g.Expect(env().Client.Create(ctx, pod)).To(Succeed())
	// The sharder may label the pod meanwhile: retry on conflicts.
	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		g.Expect(env().Client.Status().Update(ctx, pod)).To(Succeed())
	}, timeout, interval).Should(Succeed())
}

// TestShardedColocation runs the real sharder (lease and assignment
// controllers) and two instances of the operator: every cluster is
// reconciled by the instance it is assigned to, and every child it creates
// (and every member pod) lands on that same instance. When an instance
// shuts down, its clusters move with their children and the other instance
// carries on with them.
func TestShardedColocation(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	ring := newEtcdRing(t, ns)
	startSharder(t)
	endpoints := localEtcd(t)
	stopA := startInstance(t, ring, ns, "etcd-a", endpoints)
	startInstance(t, ring, ns, "etcd-b", endpoints)

	// Pick names that the ring spreads over both instances, so that the
	// move below has clusters to move and clusters to leave alone.
	var clusters []*etcdv1alpha1.EtcdCluster
	for _, name := range spreadNames(t, ns, []string{"etcd-a", "etcd-b"}, 4) {
		c := newCluster(ns, name, 3)
		g.Expect(env().Client.Create(ctx, c)).To(Succeed())
		clusters = append(clusters, c)
	}
	for _, c := range clusters[:2] {
		createMemberPod(ctx, g, c, 0)
	}
	assigned := expectColocated(ctx, g, ns, ring, []string{"etcd-a", "etcd-b"}, clusters)

	// The assigned instance sees the member pod the sharder labelled.
	for _, c := range clusters[:2] {
		g.Eventually(getCluster(ctx, c), timeout, interval).Should(WithTransform(
			func(c *etcdv1alpha1.EtcdCluster) bool { return len(c.Status.Members) == 3 && c.Status.Members[0].Ready }, BeTrue()),
			"cluster %s on %s", c.Name, assigned[c.Name])
	}

	// The assigned instance reads its StatefulSet from its own cache.
	for _, c := range clusters {
		setReadyReplicas(ctx, g, ns, c.Name, 3)
	}
	for _, c := range clusters {
		g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseRunning), "cluster %s", c.Name)
	}

	// etcd-a shuts down and releases its Lease: its clusters move to
	// etcd-b with their children, and etcd-b reconciles them.
	g.Expect(assigned).To(And(ContainElement("etcd-a"), ContainElement("etcd-b")))
	stopA()
	assigned = expectColocated(ctx, g, ns, ring, []string{"etcd-b"}, clusters)
	for _, c := range clusters {
		setReadyReplicas(ctx, g, ns, c.Name, 1)
	}
	for _, c := range clusters {
		g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
			havePhase(etcdv1alpha1.EtcdClusterPhaseFailed),
			haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonQuorumLost),
		), "cluster %s on %s", c.Name, assigned[c.Name])
	}
}

// spreadNames returns cluster names of which the ring's default algorithm
// (with the instances' default weight) puts perID on each of ids.
func spreadNames(t *testing.T, ns string, ids []string, perID int) []string {
	t.Helper()
	members := make([]ring.Member, 0, len(ids))
	for _, id := range ids {
		members = append(members, ring.Member{ID: id, VirtualNodes: sharderv1alpha1.DefaultVirtualNodes})
	}
	r, err := ring.New("", members)
	if err != nil {
		t.Fatalf("building ring: %v", err)
	}
	count := map[string]int{}
	var names []string
	for i := 0; len(names) < perID*len(ids) && i < 10000; i++ {
		name := fmt.Sprintf("sharded-%d", i)
		id, err := r.Lookup(ring.ObjectKey(etcdv1alpha1.GroupVersion.Group, "EtcdCluster", ns, name))
		if err != nil {
			t.Fatalf("looking up %s: %v", name, err)
		}
		if count[id] < perID {
			count[id]++
			names = append(names, name)
		}
	}
	if len(names) < perID*len(ids) {
		t.Fatalf("found only %v", count)
	}
	return names
}

// TestChildOutsideTheCacheIsRelabelled covers a child of the cluster that
// carries another instance's shard label and so is invisible to the
// assigned instance, as happens after a move when the ring does not list
// the child's resource: the instance gives it its owner's label and then
// manages it as usual.
func TestChildOutsideTheCacheIsRelabelled(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	const ringName, id = "etcd-relabel", "etcd-a"
	shard := sharderv1alpha1.ShardLabel(ringName)

	c := newCluster(ns, "hidden", 1)
	c.Labels = map[string]string{shard: id}
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())
	stale := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hidden-config", Labels: map[string]string{shard: "etcd-gone"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: etcdv1alpha1.GroupVersion.String(), Kind: "EtcdCluster",
				Name: c.Name, UID: c.UID, Controller: ptr.To(true)}}},
		Data: map[string]string{"stale": "true"},
	}
	g.Expect(env().Client.Create(ctx, stale)).To(Succeed())

	startManager(t, controller.Options{
		LabelChild: func(owner, child client.Object) { instance.LabelChild(ringName, owner, child) },
	}, ctrl.Options{
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		NewCache: instance.NewCache(instance.Options{Ring: ringName, Identity: id},
			&etcdv1alpha1.EtcdCluster{}, &corev1.ConfigMap{}, &corev1.Service{},
			&appsv1.StatefulSet{}, &policyv1.PodDisruptionBudget{}, &corev1.Pod{}),
	})

	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(stale), stale)).To(Succeed())
		g.Expect(stale.Labels).To(HaveKeyWithValue(shard, id))
		g.Expect(stale.Data).To(HaveKey("ETCD_INITIAL_CLUSTER_TOKEN"))
		g.Expect(stale.Data).NotTo(HaveKey("stale"))
	}, timeout, interval).Should(Succeed())
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseCreating),
		haveCondition(etcdv1alpha1.ConditionResourcesReady, metav1.ConditionTrue, etcdv1alpha1.ReasonReconciled),
	))
}
