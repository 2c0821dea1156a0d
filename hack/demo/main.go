// Command demo runs the sharder as people would on a laptop: a local control
// plane, two sharder replicas, three instances of the example etcd operator
// and a hundred EtcdClusters; then a fourth instance joins and the objects
// rebalance. It keeps everything running for kubectl until Ctrl-C and then
// cleans up. `make demo` runs it through hack/demo.sh.
//
// With --unit slots (`make demo UNIT=slots`) the ring is the example's ring
// in slot mode (docs/design.md §11): the demo shows the slot table per
// instance, and when the fourth instance joins, the slots that moved and
// that no EtcdCluster was written (slots.go). The default, --unit labels,
// is a ring of unit Objects: each object's instance in its shard label.
//
// With --cluster-kubeconfig it runs the same demo on the real one-node
// cluster instead (`make demo CLUSTER=real`, which starts it first): the
// chart, the example operator as a StatefulSet of pods, EtcdClusters that run
// etcd pods, and a scale from 3 to 4 pods; it leaves the cluster running
// (real.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// The example's ring, as its manifest declares it.
const ringManifest = "examples/etcd-operator/config/ring/controllerring.yaml"

// demoNamespace holds the EtcdClusters.
const demoNamespace = "demo"

// The units a demo's ring assigns (--unit, make demo UNIT=...).
const (
	// unitLabels: a ring of unit Objects, each object's instance in its
	// shard label (the default).
	unitLabels = "labels"
	// unitSlots: a ring of unit Slots, each object's slot in its slot
	// label and the slots' instances in the ring's status.
	unitSlots = "slots"
)

// out receives what the demo prints.
var out io.Writer = os.Stdout

func main() {
	dir := flag.String("dir", "bin/demo", "folder for the demo's kubeconfigs, binaries and logs (emptied first)")
	clusters := flag.Int("clusters", 100, "EtcdClusters to create")
	leaseDuration := flag.Duration("lease-duration", 10*time.Second, "lease duration of the operator instances")
	clusterKubeconfig := flag.String("cluster-kubeconfig", "", "run on the real cluster of this kubeconfig (make cluster) instead of a local control plane")
	helm := flag.String("helm", "", "helm binary (with --cluster-kubeconfig)")
	realClusters := flag.Int("real-clusters", 12, "EtcdClusters to create on the real cluster: each runs an etcd pod")
	unit := flag.String("unit", unitLabels, "what the ring assigns: "+unitLabels+" (unit Objects: each object's instance in its shard label) or "+
		unitSlots+" (unit Slots: each object's slot in its slot label, the slots' instances in the ring's status)")
	flag.Parse()
	if *unit != unitLabels && *unit != unitSlots {
		fmt.Fprintf(os.Stderr, "demo: --unit %q: want %s or %s\n", *unit, unitLabels, unitSlots)
		os.Exit(2)
	}

	// The control plane's start logs through controller-runtime, which
	// otherwise prints a warning with a stack trace when the build before
	// it took more than 30 s (a fresh clone).
	ctrllog.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if *clusterKubeconfig != "" {
		err = runReal(ctx, *clusterKubeconfig, *helm, *realClusters, *unit)
	} else {
		err = run(ctx, options{dir: *dir, clusters: *clusters, leaseDuration: *leaseDuration, unit: *unit, stay: true})
	}
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "\ndemo: %v\n", err)
		os.Exit(1)
	}
}

// options configures one run of the demo on a local control plane.
type options struct {
	// dir receives the run's kubeconfigs, binaries and logs.
	dir string
	// clusters is the number of EtcdClusters.
	clusters int
	// leaseDuration is the operator instances' lease duration.
	leaseDuration time.Duration
	// unit is unitLabels or unitSlots.
	unit string
	// stay keeps everything running after the story until ctx ends, for
	// kubectl; without it run cleans up at once.
	stay bool
	// hooks let a test look at the control plane during the story.
	hooks hooks
}

// hooks are called at the points of the story a test checks; nil ones are
// skipped.
type hooks struct {
	// started is called once the control plane runs, before anything is
	// created in it, with its admin config.
	started func(cfg *rest.Config) error
	// joining is called when the ring has settled on three instances,
	// before the fourth starts; joined when it has settled on four.
	joining, joined func() error
}

func call(hook func() error) error {
	if hook == nil {
		return nil
	}
	return hook()
}

// demo is one run of the demo.
type demo struct {
	cl            *localrun.Cluster
	c             client.Client
	ring          *sharderv1alpha1.ControllerRing
	unit          string
	instanceUser  *localrun.User
	leaseDuration time.Duration
	instances     []*localrun.Process
	tracker       *localrun.LabelWatch
	slots         *slotView
	kube          kube
}

// kube runs kubectl against one cluster, its output on the demo's.
type kube struct {
	kubectl, kubeconfig string
}

func (k kube) run(ctx context.Context, args ...string) {
	cmd := exec.CommandContext(ctx, k.kubectl, //nolint:gosec // the repository's kubectl with the demo's own arguments
		append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "kubectl %s: %v\n", strings.Join(args, " "), err)
	}
}

func step(format string, args ...any) {
	fmt.Fprintf(out, "\n\033[1m==> %s\033[0m\n", fmt.Sprintf(format, args...))
}

func run(ctx context.Context, o options) (err error) {
	dir, clusters := o.dir, o.clusters
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	assets, err := testenv.AssetsDir()
	if err != nil {
		return err
	}

	step("Building the sharder and the example etcd operator")
	scheme := localrun.Scheme()
	utilruntime.Must(etcdv1alpha1.AddToScheme(scheme))
	fmt.Fprintln(out, "    and starting a local control plane (etcd and kube-apiserver)")
	cl, err := localrun.NewCluster(localrun.ClusterOptions{Dir: dir, Operator: true, Scheme: scheme})
	if err != nil {
		return fmt.Errorf("the demo needs the sharder and the example operator to build and the control plane to start: %w", err)
	}
	d := &demo{cl: cl, c: cl.Client(), unit: o.unit, leaseDuration: o.leaseDuration,
		kube: kube{kubectl: filepath.Join(assets, "kubectl"), kubeconfig: cl.ControlPlane.AdminKubeconfig}}
	defer func() {
		step("Cleaning up: stopping the instances, the sharders and the control plane")
		d.stopAll()
		if err := cl.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the control plane: %v\n", err)
		}
		fmt.Fprintf(out, "    logs are in %s\n", cl.LogDir)
	}()
	if o.hooks.started != nil {
		if err := o.hooks.started(cl.ControlPlane.Config); err != nil {
			return err
		}
	}
	if err := d.setUp(ctx, scheme); err != nil {
		return err
	}
	if err := d.startSharders(ctx); err != nil {
		return err
	}
	step("Starting three instances of the example etcd operator")
	for i := range 3 {
		if err := d.startInstance(ctx, i); err != nil {
			return err
		}
	}
	step("Creating %d EtcdClusters in namespace %s", clusters, demoNamespace)
	for i := range clusters {
		obj := &etcdv1alpha1.EtcdCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: clusterName(i)},
			Spec:       etcdv1alpha1.EtcdClusterSpec{Size: 3},
		}
		if err := d.c.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating EtcdCluster %s: %w", obj.Name, err)
		}
	}
	if d.unit == unitSlots {
		err = d.slotStory(ctx, clusters, o.hooks)
	} else {
		err = d.labelStory(ctx, clusters, o.hooks)
	}
	if err != nil {
		return err
	}

	d.instructions()
	if o.stay {
		<-ctx.Done()
	}
	return nil
}

// labelStory shows the assignment in the shard labels, then a fourth
// instance joining, to which a quarter of the clusters is drained.
func (d *demo) labelStory(ctx context.Context, clusters int, h hooks) error {
	if err := d.waitSettled(ctx, clusters); err != nil {
		return err
	}
	before := d.tracker.Assignment()
	showState(ctx, d.kube, before)
	if err := call(h.joining); err != nil {
		return err
	}

	step("Adding a fourth instance: the sharder drains a quarter of the clusters to it")
	if err := d.startInstance(ctx, 3); err != nil {
		return err
	}
	if err := d.waitSettled(ctx, clusters); err != nil {
		return err
	}
	after := d.tracker.Assignment()
	if err := call(h.joined); err != nil {
		return err
	}
	showState(ctx, d.kube, after)
	moved := localrun.Moved(before, after)
	fmt.Fprintf(out, "\n    %d of %d clusters moved (ideal: a quarter, %d), each drained by its old instance first\n",
		moved, len(after), len(after)/4)
	return nil
}

func (d *demo) setUp(ctx context.Context, scheme *runtime.Scheme) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	source := ringManifest
	if d.unit == unitSlots {
		source = slotsKustomization
		if d.ring, err = slotRing(ctx, d.kube.kubectl, filepath.Join(root, slotsKustomization)); err != nil {
			return err
		}
	} else {
		data, err := os.ReadFile(filepath.Join(root, ringManifest))
		if err != nil {
			return err
		}
		d.ring = &sharderv1alpha1.ControllerRing{}
		if err := yaml.UnmarshalStrict(data, d.ring); err != nil {
			return fmt.Errorf("reading %s: %w", ringManifest, err)
		}
	}
	for _, ns := range []string{d.ring.Spec.LeaseNamespace, demoNamespace} {
		if err := localrun.EnsureNamespace(ctx, d.c, ns); err != nil {
			return err
		}
	}
	if d.unit == unitSlots {
		// As the chart and config/default install it: the guard of the
		// slot label, which the sharder binds to the ring.
		if err := installSlotPolicy(ctx, d.c, filepath.Join(root, slotPolicyManifest)); err != nil {
			return err
		}
	}
	step("Declaring the ring %q (%s)", d.ring.Name, source)
	if err := d.c.Create(ctx, d.ring); err != nil {
		return fmt.Errorf("creating the ControllerRing: %w", err)
	}
	sa := d.ring.Spec.InstanceServiceAccounts
	if len(sa) == 0 {
		return fmt.Errorf("%s names no instanceServiceAccounts", ringManifest)
	}
	if d.instanceUser, err = d.cl.ControlPlane.AddServiceAccountUser("etcd-operator", sa[0].Namespace, sa[0].Name); err != nil {
		return err
	}
	if d.unit == unitSlots {
		if err := os.MkdirAll(filepath.Dir(d.reconcileLog("")), 0o750); err != nil {
			return err
		}
		d.slots, err = newSlotView(d.cl.ControlPlane.Config, scheme, d.ring)
		return err
	}
	d.tracker, err = localrun.NewLabelWatch(d.cl.ControlPlane.Config, etcdv1alpha1.GroupVersion.WithResource("etcdclusters"), demoNamespace, d.ring.Name)
	if err != nil {
		return err
	}
	return d.tracker.Start(ctx)
}

func (d *demo) startSharders(ctx context.Context) error {
	step("Starting the sharder: two replicas, leader election, webhook at https://%s", d.cl.Webhook.Address())
	var sharders []*localrun.Sharder
	for i := range 2 {
		s, err := d.cl.StartSharder(ctx, localrun.SharderOptions{Name: fmt.Sprintf("sharder-%d", i)})
		if err != nil {
			return err
		}
		sharders = append(sharders, s)
	}
	return localrun.Poll(ctx, time.Minute, 200*time.Millisecond, func() error {
		for _, s := range sharders {
			if s.Exited() {
				return fmt.Errorf("%s exited: %w\n%s", s.Name, s.ExitError(), tail(s.Logs(), 20))
			}
			if localrun.IsLeader(s) {
				fmt.Fprintf(out, "    %s leads (pid %d); the other replica serves the webhook and stands by\n", s.Name, s.Pid())
				return nil
			}
		}
		return errors.New("no sharder replica leads yet")
	})
}

func (d *demo) startInstance(ctx context.Context, i int) error {
	id := fmt.Sprintf("etcd-operator-%d", i)
	args := []string{
		"--kubeconfig", d.instanceUser.Kubeconfig,
		"--ring", d.ring.Name,
		"--lease-namespace", d.ring.Spec.LeaseNamespace,
		"--instance", id,
		"--lease-duration", d.leaseDuration.String(),
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "0",
	}
	if d.unit == unitSlots {
		// Which clusters each instance reconciled: the slot story shows
		// that each cluster was reconciled by its slot's instance.
		args = append(args, "--reconcile-log", d.reconcileLog(id))
	}
	p, err := d.cl.Start(localrun.ProcessOptions{Name: id, Path: d.cl.Binaries.Operator, Args: args})
	if err != nil {
		return err
	}
	d.instances = append(d.instances, p)
	err = localrun.Poll(ctx, time.Minute, 200*time.Millisecond, func() error {
		if p.Exited() {
			return fmt.Errorf("instance %s exited: %w\n%s", id, p.ExitError(), tail(p.Logs(), 20))
		}
		var lease coordinationv1.Lease
		if err := d.c.Get(ctx, client.ObjectKey{Namespace: d.ring.Spec.LeaseNamespace, Name: id}, &lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != id {
			return errors.New("lease not held yet")
		}
		return nil
	})
	if err == nil {
		fmt.Fprintf(out, "    %s holds its Lease (pid %d)\n", id, p.Pid())
	}
	return err
}

func (d *demo) waitSettled(ctx context.Context, n int) error {
	return waitSettled(ctx, d.tracker, n, d.liveInstances())
}

// liveInstances returns the IDs of the instances still running.
func (d *demo) liveInstances() []string {
	var ids []string
	for _, p := range d.instances {
		if !p.Exited() {
			ids = append(ids, p.Name)
		}
	}
	return ids
}

// waitSettled waits until the n EtcdClusters sit on the instances of ids
// the ring chooses, none draining.
func waitSettled(ctx context.Context, tracker *localrun.LabelWatch, n int, ids []string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	start := time.Now()
	if err := tracker.Wait(ctx, localrun.SettledOn(etcdClusterKind, n, ids...)); err != nil {
		return fmt.Errorf("waiting for the assignment: %w", err)
	}
	fmt.Fprintf(out, "    all %d EtcdClusters assigned to their instances (%s)\n", n, time.Since(start).Round(time.Millisecond))
	return nil
}

var etcdClusterKind = etcdv1alpha1.GroupVersion.WithKind("EtcdCluster").GroupKind()

// showState prints the membership view and the distribution.
func showState(ctx context.Context, k kube, a localrun.Assignment) {
	step("Membership: kubectl get leases -A -l sharder.dev/ring -L sharder.dev/ring,sharder.dev/state,sharder.dev/virtual-nodes")
	k.run(ctx, "get", "leases", "-A", "-l", sharderv1alpha1.LabelRing,
		"-L", strings.Join([]string{sharderv1alpha1.LabelRing, sharderv1alpha1.LabelState, sharderv1alpha1.LabelVirtualNodes}, ","))
	step("The ring: kubectl get controllerrings")
	k.run(ctx, "get", "controllerrings")
	step("Distribution: EtcdClusters per instance")
	fmt.Fprint(out, localrun.FormatCounts(a.Counts()))
}

func (d *demo) instructions() {
	if d.unit == unitSlots {
		d.slotInstructions()
		return
	}
	k := d.kube.kubeconfig
	shard := sharderv1alpha1.ShardLabel(d.ring.Name)
	step("The demo keeps running. In another shell:")
	fmt.Fprintf(out, `
    export KUBECONFIG=%s PATH=%s:$PATH

    kubectl get etcdclusters -n %s -L %s
    kubectl get statefulsets,services,configmaps -n %s -L %s   # children follow their cluster
    kubectl get leases -A -l sharder.dev/ring -L sharder.dev/ring,sharder.dev/state,sharder.dev/virtual-nodes
    kubectl get controllerrings -o wide
    %s status

    # Only the sharder may change the labels: this is denied by its webhook.
    kubectl label etcdcluster -n %s etcd-000 %s=someone-else --overwrite

    # Kill an instance: its Lease expires, the sharder declares it dead after
    # 2 × %s and moves its clusters to the others.
    kill -9 %d
    # Or stop one gracefully: it releases its Lease and its clusters move at once.
    kill %d

Logs of every process: %s
Press Ctrl-C to stop the demo and clean up.
`, k, filepath.Dir(d.kube.kubectl), demoNamespace, shard, demoNamespace, shard, d.cl.Binaries.Sharder,
		demoNamespace, shard, d.leaseDuration, d.instances[1].Pid(), d.instances[2].Pid(), d.cl.LogDir)
}

// stopAll stops the instances (they release their Leases), then the
// sharders.
func (d *demo) stopAll() {
	for _, p := range d.instances {
		_ = p.Stop(15 * time.Second)
	}
	for _, p := range d.cl.Processes.All() {
		_ = p.Stop(15 * time.Second)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
