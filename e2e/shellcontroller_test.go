package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// shellAnnotation is what the shell controller writes on each ConfigMap it
// reconciles: its instance ID (examples/shell-controller/controller.sh).
const shellAnnotation = "shell-controller.sharder.dev/reconciled-by"

// ShellControllerInput configures ShellControllerSpec.
type ShellControllerInput struct {
	// Objects is the number of ConfigMaps in the ring.
	Objects int
	// TouchEvery is how often one ConfigMap after the other is changed
	// while the instances come and go.
	TouchEvery time.Duration
	// Timeout bounds each wait.
	Timeout time.Duration
}

// ShellControllerSpec: the example controller written in POSIX shell
// (examples/shell-controller/controller.sh, a polling loop around kubectl,
// run by busybox's shell as in its image) runs as 2 instances, each beside
// `sharder agent`. While its ConfigMaps keep changing, a third instance
// joins (the sharder drains objects off the first two, forcing each move
// when the ring's drainTimeout ends, since an agent never acknowledges a
// drain) and then the first one leaves the way a pod's containers stop: the
// script first, which finishes its reconcile in flight, then its agent,
// which releases the Lease. Every object settles on the instances the ring
// chooses, is last reconciled by the instance it sits on, carries that
// instance's annotation, and no object is ever reconciled by two instances
// at once.
func ShellControllerSpec(t *testing.T, in ShellControllerInput) {
	e := newRingEnv(t, ringOptions{
		Resources:   []sharderv1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
		Watched:     corev1.SchemeGroupVersion.WithResource("configmaps"),
		TrackedKind: schema.GroupKind{Kind: "ConfigMap"},
	})
	e.startShellInstance("instance-0")
	e.startShellInstance("instance-1")
	e.startSharders()
	for i := range in.Objects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: fmt.Sprintf("obj-%03d", i)}}
		e.g.Expect(e.c.Create(e.ctx, cm)).To(gomega.Succeed())
	}
	e.waitSettled(in.Objects, in.Timeout)
	e.expectReconciledByOwner(in.Timeout)
	e.expectAnnotatedByOwner(in.Timeout)

	stop := e.touchConfigMaps(in.Objects, in.TouchEvery)
	e.startShellInstance("instance-2")
	scaledOut := e.waitSettled(in.Objects, in.Timeout, "instance-0", "instance-1", "instance-2")
	t.Logf("scaled out: %v", scaledOut.Counts())

	// A pod's deletion: the controller container stops, then the native
	// sidecar.
	e.stopInstance("instance-0")
	e.g.Expect(e.agent("instance-0").Stop(30 * time.Second)).To(gomega.Succeed())
	scaledIn := e.waitSettled(in.Objects, in.Timeout, "instance-1", "instance-2")
	t.Logf("scaled in: %v", scaledIn.Counts())
	stop()

	e.expectReconciledByOwner(in.Timeout)
	e.expectAnnotatedByOwner(in.Timeout)
	ivs := e.expectNoOverlap()
	failed := 0
	for _, iv := range ivs {
		if iv.Error != "" {
			failed++
		}
	}
	t.Logf("%d reconciles (%d ended in an error, such as a conflict with a change made since the list), none of one object by two instances at once", len(ivs), failed)
	e.g.Expect(e.agent("instance-0").Logs()).To(gomega.ContainSubstring("Released the instance Lease"))
}

func TestShellControllerWithAgent(t *testing.T) {
	ShellControllerSpec(t, ShellControllerInput{Objects: 12, TouchEvery: 300 * time.Millisecond, Timeout: 90 * time.Second})
}

// startShellInstance starts the shell controller as instance id with
// `sharder agent` beside it, each restarted when it exits as a pod's
// containers are, and waits until the agent holds the instance's Lease.
func (e *ringEnv) startShellInstance(id string, agentArgs ...string) {
	e.t.Helper()
	root, err := testenv.RepoRoot()
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	assets, err := testenv.AssetsDir()
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	// The shell of the controller's image: busybox, which make images
	// fetches (hack/busybox.sh).
	busybox := filepath.Join(root, "bin", "images", "linux-"+runtime.GOARCH, "busybox")
	if _, err := os.Stat(busybox); err != nil {
		e.t.Fatalf("busybox not found (%v): run `make images`, which fetches it", err)
	}
	tmp := filepath.Join(cluster.Dir, e.ring, "tmp-"+id)
	e.g.Expect(os.MkdirAll(tmp, 0o750)).To(gomega.Succeed())
	health, err := localrun.FreeAddress()
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	controller, err := cluster.Start(localrun.ProcessOptions{
		Name: e.ring + "-" + id, Path: busybox,
		Args: []string{"sh", filepath.Join(root, "examples", "shell-controller", "controller.sh"),
			"--ring=" + e.ring,
			"--namespace=" + e.namespace,
			"--name=" + id,
			"--health-address=" + health,
			"--reconcile-log=" + e.reconcileLog(id),
			"--kubectl=" + filepath.Join(assets, "kubectl"),
		},
		Env:     []string{"KUBECONFIG=" + e.instanceUser.Kubeconfig, "TMPDIR=" + tmp},
		Restart: instanceRestart,
	})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.procs.Add(controller)
	agent := e.launchAgent(id, controller, health, agentArgs...)
	e.waitHeld(id, controller, agent)
}

// expectAnnotatedByOwner waits until every ConfigMap carries the shell
// controller's annotation naming the instance it is assigned to.
func (e *ringEnv) expectAnnotatedByOwner(timeout time.Duration) {
	e.t.Helper()
	e.g.Eventually(func(g gomega.Gomega) {
		var list corev1.ConfigMapList
		g.Expect(e.c.List(e.ctx, &list, client.InNamespace(e.namespace))).To(gomega.Succeed())
		g.Expect(list.Items).NotTo(gomega.BeEmpty())
		for _, cm := range list.Items {
			owner := cm.Labels[sharderv1alpha1.ShardLabel(e.ring)]
			g.Expect(owner).NotTo(gomega.BeEmpty(), "%s is assigned", cm.Name)
			g.Expect(cm.Annotations).To(gomega.HaveKeyWithValue(shellAnnotation, owner), "%s reconciled by its instance", cm.Name)
		}
	}).WithTimeout(timeout).WithPolling(250 * time.Millisecond).Should(gomega.Succeed())
}

// touchConfigMaps changes an annotation of one of the n ConfigMaps after
// the other, one every interval, until the returned stop is called.
func (e *ringEnv) touchConfigMaps(n int, every time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: fmt.Sprintf("obj-%03d", i%n)}}
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"e2e.sharder.dev/touched":"%d"}}}`, i)
			if err := e.c.Patch(ctx, cm, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil && ctx.Err() == nil {
				e.t.Errorf("touching %s: %v", cm.Name, err)
				return
			}
		}
	}()
	stop = func() { cancel(); wg.Wait() }
	e.t.Cleanup(stop)
	return stop
}
