package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// What the real-cluster demo installs: the chart with its default values,
// and the example operator's kustomization as it is.
const (
	chartRelease      = "sharder"
	sharderNamespace  = "sharder-system"
	operatorKustomize = "examples/etcd-operator/config"
	operatorNamespace = "etcd-operator-system"
	operatorName      = "etcd-operator"
	operatorRing      = "etcd-operator"
	// storageClass is the class of the volumes the demo makes for the etcd
	// members: the cluster has no provisioner, so each is a hostPath
	// PersistentVolume made in advance.
	storageClass = "demo-hostpath"
)

// runReal runs the demo on the real cluster of kubeconfig (make cluster):
// helm install of the chart, the example operator as a StatefulSet of 3
// pods, clusters EtcdClusters (each running an etcd pod), the membership
// and the assignment, then a scale to 4 pods that shows the drains (in slot
// mode, the slots' releases and grants). It leaves everything running and
// prints what to look at.
func runReal(ctx context.Context, kubeconfig, helm string, clusters int, unit string) error {
	if helm == "" {
		return fmt.Errorf("--helm is required with --cluster-kubeconfig")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	assets, err := testenv.AssetsDir()
	if err != nil {
		return err
	}
	k := kube{kubectl: filepath.Join(assets, "kubectl"), kubeconfig: kubeconfig}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	scheme := localrun.Scheme()
	utilruntime.Must(etcdv1alpha1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}

	step("Installing the sharder: helm install %s charts/sharder --namespace %s --create-namespace", chartRelease, sharderNamespace)
	if err := tool(ctx, helm, "--kubeconfig", kubeconfig, "install", chartRelease, filepath.Join(root, "charts", "sharder"),
		"--namespace", sharderNamespace, "--create-namespace", "--wait", "--timeout", "3m"); err != nil {
		return err
	}
	k.run(ctx, "get", "pods", "--namespace", sharderNamespace)

	kustomization := operatorKustomize
	if unit == unitSlots {
		kustomization = slotsKustomization
	}
	step("The example etcd operator, 3 instances in a StatefulSet: kubectl apply -k %s", kustomization)
	if err := k.must(ctx, "apply", "--server-side", "-k", filepath.Join(root, kustomization)); err != nil {
		return err
	}
	if err := k.must(ctx, "rollout", "status", "statefulset", operatorName, "--namespace", operatorNamespace, "--timeout", "3m"); err != nil {
		return err
	}
	if unit == unitSlots {
		if err := slotModeOperators(ctx, k); err != nil {
			return err
		}
	}
	k.run(ctx, "get", "pods", "--namespace", operatorNamespace)

	var tracker *localrun.LabelWatch
	var view *slotView
	ring := &sharderv1alpha1.ControllerRing{}
	if unit == unitSlots {
		if err := c.Get(ctx, client.ObjectKey{Name: operatorRing}, ring); err != nil {
			return err
		}
		if view, err = newSlotView(cfg, scheme, ring); err != nil {
			return err
		}
	} else {
		if tracker, err = localrun.NewLabelWatch(cfg, etcdv1alpha1.GroupVersion.WithResource("etcdclusters"), demoNamespace, operatorRing); err != nil {
			return err
		}
		if err := tracker.Start(ctx); err != nil {
			return err
		}
	}
	step("Creating %d EtcdClusters of one member each in namespace %s", clusters, demoNamespace)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}); err != nil {
		return err
	}
	if err := createVolumes(ctx, c, filepath.Join(filepath.Dir(kubeconfig), "demo-volumes"), clusters); err != nil {
		return err
	}
	for i := range clusters {
		obj := &etcdv1alpha1.EtcdCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: realClusterName(i)},
			Spec: etcdv1alpha1.EtcdClusterSpec{Size: 1, Storage: etcdv1alpha1.EtcdStorageSpec{
				StorageClassName: ptr.To(storageClass), Size: ptr.To(volumeSize),
			}},
		}
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating EtcdCluster %s: %w", obj.Name, err)
		}
	}
	if unit == unitSlots {
		if err := realSlotJoin(ctx, k, view, clusters); err != nil {
			return err
		}
		realSlotInstructions(kubeconfig, k.kubectl, ring)
		return nil
	}
	if err := waitSettled(ctx, tracker, clusters, operatorPods(3)); err != nil {
		return err
	}
	before := tracker.Assignment()
	showState(ctx, k, before)
	shard := sharderv1alpha1.ShardLabel(operatorRing)
	step("Assignment: kubectl get etcdclusters -n %s -L %s", demoNamespace, shard)
	k.run(ctx, "get", "etcdclusters", "--namespace", demoNamespace, "-L", shard)

	step("Scaling the operator to 4 pods: kubectl scale statefulset %s --replicas=4", operatorName)
	if err := k.must(ctx, "scale", "statefulset", operatorName, "--namespace", operatorNamespace, "--replicas=4"); err != nil {
		return err
	}
	fmt.Fprintln(out, "    the sharder asks the old instance to drain each cluster that moves, then labels it for the new one:")
	if err := showMoves(ctx, tracker, clusters, operatorPods(4)); err != nil {
		return err
	}
	after := tracker.Assignment()
	showState(ctx, k, after)
	fmt.Fprintf(out, "\n    %d of %d clusters moved (ideal: a quarter, %d), each drained by its old instance first\n",
		localrun.Moved(before, after), len(after), len(after)/4)
	realInstructions(kubeconfig, k.kubectl)
	return nil
}

// realSlotJoin shows the slot table on 3 pods, then scales the operator to
// 4 and shows the slots' releases, acknowledgements and grants, and that no
// EtcdCluster's labels were written (the operator writes the status of
// each as its etcd pod starts: its own business, reported apart).
func realSlotJoin(ctx context.Context, k kube, view *slotView, clusters int) error {
	before, err := view.waitSettled(ctx, clusters, operatorPods(3))
	if err != nil {
		return err
	}
	view.show(ctx, k, before)
	label := sharderv1alpha1.SlotLabel(operatorRing)
	step("Slot labels: kubectl get etcdclusters -n %s -L %s", demoNamespace, label)
	k.run(ctx, "get", "etcdclusters", "--namespace", demoNamespace, "-L", label)

	step("Scaling the operator to 4 pods: kubectl scale statefulset %s --replicas=4", operatorName)
	if err := k.must(ctx, "scale", "statefulset", operatorName, "--namespace", operatorNamespace, "--replicas=4"); err != nil {
		return err
	}
	fmt.Fprintln(out, "    each old holder is asked to release slots and acknowledges on its Lease, then the sharder grants them:")
	if _, err := view.follow(ctx, before, operatorPods(4)); err != nil {
		return err
	}
	after, err := view.waitSettled(ctx, clusters, operatorPods(4))
	if err != nil {
		return err
	}
	view.show(ctx, k, after)
	reportJoin(before, after)
	return nil
}

var volumeSize = resource.MustParse("64Mi")

// createVolumes makes n hostPath PersistentVolumes of storageClass in
// folders under dir, one for each etcd member's claim.
func createVolumes(ctx context.Context, c client.Client, dir string, n int) error {
	// Left from an earlier demo: an etcd member must start empty.
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := c.Create(ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: storageClass},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}); err != nil {
		return err
	}
	for i := range n {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("demo-%02d", i)},
			Spec: corev1.PersistentVolumeSpec{
				StorageClassName: storageClass,
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Capacity:         corev1.ResourceList{corev1.ResourceStorage: volumeSize},
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
					Path: filepath.Join(dir, fmt.Sprintf("%02d", i)), Type: ptr.To(corev1.HostPathDirectoryOrCreate),
				}},
			},
		}
		if err := c.Create(ctx, pv); err != nil {
			return err
		}
	}
	return nil
}

// showMoves prints each drain and each move as the tracker sees it, until
// the n EtcdClusters are settled on ids.
func showMoves(ctx context.Context, tracker *localrun.LabelWatch, n int, ids []string) error {
	last := tracker.Assignment().ByKey()
	draining := map[string]bool{}
	settled := localrun.SettledOn(etcdClusterKind, n, ids...)
	report := func(objs []localrun.Watched) error {
		for _, o := range objs {
			if o.Draining && !draining[o.Key] {
				fmt.Fprintf(out, "    %s: drain requested on %s\n", o.Key, o.Instance)
			}
			draining[o.Key] = o.Draining
			if prev := last[o.Key]; prev != o.Instance && o.Instance != "" {
				fmt.Fprintf(out, "    %s: %s -> %s\n", o.Key, prev, o.Instance)
			}
			if o.Instance != "" {
				last[o.Key] = o.Instance
			}
		}
		return settled(objs)
	}
	if err := tracker.Wait(ctx, report); err != nil {
		return err
	}
	return waitSettled(ctx, tracker, n, ids)
}

// operatorPods returns the instance IDs of the operator's first n pods.
func operatorPods(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", operatorName, i)
	}
	return ids
}

// objectModeLine is what the example operator logs at start when it found
// no ring to read, and so runs in object mode.
const objectModeLine = "Cannot read the ring: running in object mode"

// slotModeOperators makes sure the operator's pods run in slot mode: the
// operator reads its ring's unit once, at start, and kubectl apply creates
// the StatefulSet before the ring (kustomize orders kinds it does not know
// last), so a pod quick to start may have found no ring. Such pods are
// restarted, once the ring is there.
func slotModeOperators(ctx context.Context, k kube) error {
	var early []string
	for _, pod := range operatorPods(3) {
		logs, err := k.output(ctx, "logs", "--namespace", operatorNamespace, pod)
		if err != nil {
			return err
		}
		if strings.Contains(logs, objectModeLine) {
			early = append(early, pod)
		}
	}
	if len(early) == 0 {
		return nil
	}
	step("Restarting the operator: %s started before its ring existed and runs in object mode", strings.Join(early, ", "))
	if err := k.must(ctx, "rollout", "restart", "statefulset", operatorName, "--namespace", operatorNamespace); err != nil {
		return err
	}
	return k.must(ctx, "rollout", "status", "statefulset", operatorName, "--namespace", operatorNamespace, "--timeout", "3m")
}

// output runs kubectl and returns its output.
func (k kube) output(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, k.kubectl, append([]string{"--kubeconfig", k.kubeconfig}, args...)...) //nolint:gosec // the repository's kubectl with the demo's own arguments
	var stderr strings.Builder
	cmd.Stderr = &stderr
	data, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(data), nil
}

// must runs kubectl with its output on the demo's and returns its error.
func (k kube) must(ctx context.Context, args ...string) error {
	return tool(ctx, k.kubectl, append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
}

// tool runs a command with its output on the demo's.
func tool(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...) //nolint:gosec // the repository's kubectl and helm with the demo's own arguments
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", filepath.Base(name), strings.Join(args, " "), err)
	}
	return nil
}

func realInstructions(kubeconfig, kubectl string) {
	shard := sharderv1alpha1.ShardLabel(operatorRing)
	step("The cluster keeps running. In another shell:")
	fmt.Fprintf(out, `
    export KUBECONFIG=%s PATH=%s:$PATH

    kubectl get pods -A                                    # the sharder, the operator's instances, the etcd pods
    kubectl get etcdclusters -n %s -L %s
    kubectl get statefulsets,services,pods -n %s -L %s   # children follow their cluster
    kubectl get leases -A -l sharder.dev/ring -L sharder.dev/ring,sharder.dev/state,sharder.dev/virtual-nodes
    kubectl get controllerrings -o wide
    kubectl get events -A --field-selector involvedObject.kind=ControllerRing
    kubectl logs -n %s -l app.kubernetes.io/name=sharder --prefix --tail=20

    # Only the sharder may change the labels: this is denied by its webhook.
    kubectl label etcdcluster -n %s etcd-00 %s=someone-else --overwrite

    # Delete an instance's pod: it hands its Lease back restarting on the
    # way out (--release=Restart), its clusters stay where they are, written
    # by nobody, until the new pod of the same name holds the Lease again
    # (within the ring's restartHold, 30s; past it they would move).
    kubectl delete pod -n %s %s-1
    # Scale back to 3: the fourth instance's clusters are handed back.
    kubectl scale statefulset -n %s %s --replicas=3

Tear it down (as root) with: make cluster-down
`, kubeconfig, filepath.Dir(kubectl), demoNamespace, shard, demoNamespace, shard, sharderNamespace,
		demoNamespace, shard, operatorNamespace, operatorName, operatorNamespace, operatorName)
}

func realSlotInstructions(kubeconfig, kubectl string, ring *sharderv1alpha1.ControllerRing) {
	label := sharderv1alpha1.SlotLabel(operatorRing)
	other := (slotOf(ring, realClusterName(0)) + 1) % ring.Spec.EffectiveSlotCount()
	step("The cluster keeps running. In another shell:")
	fmt.Fprintf(out, `
    export KUBECONFIG=%s PATH=%s:$PATH

    kubectl get pods -A                                    # the sharder, the operator's instances, the etcd pods
    kubectl get etcdclusters -n %s -L %s
    kubectl get statefulsets,services,pods -n %s -L %s   # children carry their cluster's slot
    kubectl get leases -A -l sharder.dev/ring -L sharder.dev/ring,sharder.dev/state
    kubectl get controllerring %s -o yaml                 # status.slots: the slot table
    kubectl get events -A --field-selector involvedObject.kind=ControllerRing
    kubectl logs -n %s -l app.kubernetes.io/name=sharder --prefix --tail=20

    # A slot label never changes: this is denied by the policy slot-label.sharder.dev.
    kubectl label etcdcluster -n %s %s %s=%d --overwrite

    # Delete an instance's pod: it releases its Lease as restarting, and its
    # slots wait for the new pod, which has the same name (up to the ring's
    # restartHold, 30 s): no slot moves.
    kubectl delete pod -n %s %s-1
    # Scale back to 3: the fourth instance's slots go to the others once the
    # restartHold has passed (its pod, too, released its Lease as restarting).
    kubectl scale statefulset -n %s %s --replicas=3

Tear it down (as root) with: make cluster-down
`, kubeconfig, filepath.Dir(kubectl), demoNamespace, label, demoNamespace, label, operatorRing, sharderNamespace,
		demoNamespace, realClusterName(0), label, other, operatorNamespace, operatorName, operatorNamespace, operatorName)
}

// realClusterName is the name of the i-th EtcdCluster on the real cluster.
func realClusterName(i int) string { return fmt.Sprintf("etcd-%02d", i) }
