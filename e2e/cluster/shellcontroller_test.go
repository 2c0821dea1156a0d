package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// The shell controller's example (examples/shell-controller): a controller
// written in POSIX shell, a loop around kubectl in an image of busybox and
// kubectl, with `sharder agent` as a native sidecar in each pod.
const (
	shellRing      = "shell-controller"
	shellNamespace = "shell-controller-system"
	shellName      = "shell-controller"
	shellObjects   = "shell-controller-objects"
	// shellConfigMaps is how many ConfigMaps the scenario creates; the
	// namespace's kube-root-ca.crt is one more object of the ring.
	shellConfigMaps = 12
	// shellAnnotation is what the script writes on each ConfigMap it
	// reconciles: its instance ID.
	shellAnnotation = "shell-controller.sharder.dev/reconciled-by"
	// shellRestartSlack is how much longer than its pod's restart a
	// ConfigMap may be without a reconciling instance on a rolling update:
	// as for the plain controller (the agents' Leases are as long), the
	// agent acquires the Lease up to one renew period after the script's
	// health endpoint answers; and one renew period more for an attempt
	// that timed out: the scripts start a kubectl process for every list
	// and every write, and on a 2-core node that also runs the control
	// plane and other tests, an API request of the new pod's agent timed
	// out twice in a fresh-clone run (the gap was 88 ms over the plain
	// controller's bound; nothing moved and nothing overlapped).
	shellRestartSlack = restartSlack + 2*plainLeaseSeconds*time.Second/3
)

// testShellControllerWithAgent: the shell controller's kustomization, applied
// as it is but for each pod's reconcile log and 5 s Leases, runs 2 pods of
// the image make images packs (busybox, kubectl and the script), each with
// the agent holding its Lease. Its ConfigMaps settle on the 2 instances,
// each reconciled (annotated) by its own; then kubectl rollout restart
// replaces the pods one by one while the ConfigMaps keep changing. Each
// pod's script finishes its reconcile in flight and exits on SIGTERM, its
// agent then hands the Lease back restarting: no ConfigMap moves, none is
// without a reconciling instance for longer than its pod's restart and
// shellRestartSlack, none is reconciled by two pods at once, and at the end
// every one is on the instance the ring of the 2 chooses, last reconciled
// and annotated by it. The example is deleted at the end: its pods poll the
// API server every second.
func testShellControllerWithAgent(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	ids := []string{shellName + "-0", shellName + "-1"}
	began := time.Now()
	elapsed := func() time.Duration { return time.Since(began).Round(100 * time.Millisecond) }
	config := filepath.Join(repoRoot, "examples", "shell-controller", "config")

	By(t, "the shell controller's kustomization, with each pod's reconcile log on the node")
	logs := reconcileLogDir(t)
	t.Cleanup(func() {
		// Before the logs' folder goes (cleanups run last first). The ring
		// first: the sharder removes its labels from the ConfigMaps with the
		// access the example's ClusterRole grants it.
		for _, args := range [][]string{
			{"delete", "controllerring", shellRing, "--ignore-not-found", "--wait=true", "--timeout=2m"},
			{"delete", "-k", config, "--ignore-not-found", "--wait=true", "--timeout=3m"},
		} {
			if _, err := kubectl(context.Background(), args...); err != nil {
				t.Logf("deleting the shell controller: %v", err)
			}
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			// The scripts' own account of their lists and writes, and the
			// reconcile logs, before the example and the logs go.
			args := []string{"logs", "--namespace", shellNamespace, "-l", "app.kubernetes.io/name=" + shellName, "--all-containers", "--prefix", "--tail=100"}
			out, err := kubectl(context.Background(), args...)
			t.Logf("kubectl %s (%v):\n%s", strings.Join(args, " "), err, out)
			recs := readReconcileLogs(NewWithT(t), logs)
			for _, r := range recs[max(0, len(recs)-60):] {
				t.Logf("reconcile log: %s %s %s %s %s", r.Time.Format(time.StampMilli), r.Instance, r.Object, r.Phase, r.Error)
			}
		}
	})
	applyWithReconcileLog(ctx, t, g, config, shellName, logs, func(sts *appsv1.StatefulSet, _ *corev1.Container) {
		agents := sts.Spec.Template.Spec.InitContainers
		g.Expect(agents).To(HaveLen(1))
		g.Expect(agents[0].Args).NotTo(ContainElement(HavePrefix("--lease-duration")))
		agents[0].Args = append(agents[0].Args, fmt.Sprintf("--lease-duration=%ds", plainLeaseSeconds))
	})
	waitStatefulSetReady(ctx, g, shellNamespace, shellName, int32(len(ids)))
	waitRingReady(ctx, g, shellRing, ids)
	t.Logf("%s: 2 pods ready, each an instance", elapsed())

	gvr := corev1.SchemeGroupVersion.WithResource("configmaps")
	tracker, err := localrun.NewLabelWatch(restConfig, gvr, shellObjects, shellRing)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tracker.Start(ctx)).To(Succeed())
	labels := newLabelRecorder(ctx, t, gvr, shellObjects, shellRing)
	states := newRingStateRecorder(ctx, t, shellRing)
	pods := newRolloutRecorder(ctx, t, shellNamespace, shellName)

	By(t, fmt.Sprintf("%d ConfigMaps spread over the 2 instances", shellConfigMaps))
	for i := range shellConfigMaps {
		g.Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: shellObjects, Name: fmt.Sprintf("object-%02d", i),
		}})).To(Succeed())
	}
	before := waitSettledOn(ctx, t, tracker, configMapKind, shellConfigMaps+1, ids)
	expectReconciledByOwner(g, logs, before)
	expectAnnotatedByOwner(ctx, g)
	t.Logf("%s: the ConfigMaps settled, each annotated by its instance", elapsed())

	By(t, "kubectl rollout restart while the ConfigMaps keep changing")
	stop := touchConfigMaps(ctx, t, shellObjects, shellConfigMaps)
	start := time.Now()
	old, replaced := rollStatefulSet(ctx, t, g, shellNamespace, shellName, len(ids))
	stop()
	t.Logf("%s: every pod replaced and Ready", elapsed())
	waitRingReady(ctx, g, shellRing, ids)
	expectNoMoves(t, g, rollout{before: before, start: start, old: old, replaced: replaced, slack: shellRestartSlack,
		logs: logs, labels: labels, states: states, pods: pods})

	after := waitSettledOn(ctx, t, tracker, configMapKind, shellConfigMaps+1, ids)
	expectReconciledByOwner(g, logs, after)
	expectAnnotatedByOwner(ctx, g)
	expectNoOverlap(g, logs)
	var during int
	for _, iv := range reconcilelog.Intervals(readReconcileLogs(g, logs), nil, time.Now()) {
		if iv.Start.After(start) {
			during++
		}
	}
	t.Logf("%s: settled again; %d reconciles since the restart began; ConfigMaps after the rolling update:\n%s", elapsed(), during, localrun.FormatCounts(after.Counts()))
}

// expectAnnotatedByOwner waits until every ConfigMap of the shell
// controller's ring carries the script's annotation naming the instance it
// is assigned to.
func expectAnnotatedByOwner(ctx context.Context, g Gomega) {
	g.Eventually(func(g Gomega) {
		var list corev1.ConfigMapList
		g.Expect(k8sClient.List(ctx, &list, client.InNamespace(shellObjects))).To(Succeed())
		g.Expect(list.Items).NotTo(BeEmpty())
		for _, cm := range list.Items {
			owner := cm.Labels[sharderv1alpha1.ShardLabel(shellRing)]
			g.Expect(owner).NotTo(BeEmpty(), "%s is assigned", cm.Name)
			g.Expect(cm.Annotations).To(HaveKeyWithValue(shellAnnotation, owner), "%s annotated by its instance", cm.Name)
		}
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
}
