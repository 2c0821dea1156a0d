package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
)

// The plain controller's example (e2e/plaincontroller/config): a controller
// that knows nothing of sharder beyond a label selector, with `sharder
// agent` as a native sidecar in each pod.
const (
	plainRing      = "plaincontroller"
	plainNamespace = "plaincontroller-system"
	plainName      = "plaincontroller"
	plainObjects   = "plaincontroller-objects"
	// plainConfigMaps is how many ConfigMaps the scenario creates; the
	// namespace's kube-root-ca.crt is one more object of the ring.
	plainConfigMaps = 12
	// plainReconcile is how long each reconcile of the scenario's
	// ConfigMaps takes: a pod told to stop has reconciles to finish before
	// its agent hands the Lease back, and the moves the ring may force
	// (drainTimeout) leave 2 s between a release and its assignment.
	plainReconcile = 200 * time.Millisecond
	// plainLeaseSeconds is the agents' lease duration (the example's is the
	// agent's default, 15 s): a pod that stops without releasing its Lease
	// holds its ConfigMaps for 2 lease durations.
	plainLeaseSeconds = 5
	// plainRestartSlack is how much longer than its pod's restart a
	// ConfigMap may be without a reconciling instance on a rolling update.
	// The agent, a native sidecar, starts before the controller and
	// acquires the Lease only once the controller's health endpoint
	// answers; it asks again every renew period (a third of the lease
	// duration), so it acquires the Lease up to one renew period after the
	// controller is up.
	plainRestartSlack = restartSlack + plainLeaseSeconds*time.Second/3
)

var configMapKind = schema.GroupKind{Kind: "ConfigMap"}

// testPlainControllerWithAgent: the plain controller's kustomization, applied
// as it is but for each pod's reconcile log and 5 s Leases, runs 2 pods, each
// with the agent holding its Lease. Its ConfigMaps settle on the 2 instances;
// then kubectl rollout restart replaces the pods one by one while the ConfigMaps keep
// changing. Each pod's controller finishes its reconciles before its agent
// hands the Lease back marked as restarting (--release=Restart), so the
// sharder keeps the pod's ConfigMaps where they are and the new pod's agent
// acquires the Lease once its controller is up: no ConfigMap moves, none is
// without a reconciling instance for longer than its pod's restart and
// plainRestartSlack, none is reconciled by two pods at once, and at the end
// every one is on the instance the ring of the 2 chooses, last reconciled
// there.
func testPlainControllerWithAgent(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	ids := []string{plainName + "-0", plainName + "-1"}
	began := time.Now()
	elapsed := func() time.Duration { return time.Since(began).Round(100 * time.Millisecond) }

	By(t, "the plain controller's kustomization, with each pod's reconcile log on the node")
	logs := plainLogs
	applyWithReconcileLog(ctx, t, g, filepath.Join(repoRoot, "e2e", "plaincontroller", "config"), plainName, logs, func(sts *appsv1.StatefulSet, _ *corev1.Container) {
		agents := sts.Spec.Template.Spec.InitContainers
		g.Expect(agents).To(HaveLen(1))
		g.Expect(agents[0].Args).NotTo(ContainElement(HavePrefix("--lease-duration")))
		agents[0].Args = append(agents[0].Args, fmt.Sprintf("--lease-duration=%ds", plainLeaseSeconds))
	})
	waitStatefulSetReady(ctx, g, plainNamespace, plainName, int32(len(ids)))
	waitRingReady(ctx, g, plainRing, ids)
	t.Logf("%s: 2 pods ready, each an instance", elapsed())

	gvr := corev1.SchemeGroupVersion.WithResource("configmaps")
	tracker, err := localrun.NewLabelWatch(restConfig, gvr, plainObjects, plainRing)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tracker.Start(ctx)).To(Succeed())
	labels := newLabelRecorder(ctx, t, gvr, plainObjects, plainRing)
	states := newRingStateRecorder(ctx, t, plainRing)
	pods := newRolloutRecorder(ctx, t, plainNamespace, plainName)

	By(t, fmt.Sprintf("%d ConfigMaps spread over the 2 instances", plainConfigMaps))
	for i := range plainConfigMaps {
		g.Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: plainObjects, Name: fmt.Sprintf("object-%02d", i),
			Annotations: map[string]string{"e2e.sharder.dev/reconcile-duration": plainReconcile.String()},
		}})).To(Succeed())
	}
	before := waitSettledOn(ctx, t, tracker, configMapKind, plainConfigMaps+1, ids)
	expectReconciledByOwner(g, logs, before)
	t.Logf("%s: the ConfigMaps settled", elapsed())

	By(t, "kubectl rollout restart while the ConfigMaps keep changing")
	stop := touchConfigMaps(ctx, t, plainObjects, plainConfigMaps)
	start := time.Now()
	old, replaced := rollStatefulSet(ctx, t, g, plainNamespace, plainName, len(ids))
	stop()
	t.Logf("%s: every pod replaced and Ready", elapsed())
	waitRingReady(ctx, g, plainRing, ids)
	expectNoMoves(t, g, rollout{before: before, start: start, old: old, replaced: replaced, slack: plainRestartSlack,
		logs: logs, labels: labels, states: states, pods: pods})

	after := waitSettledOn(ctx, t, tracker, configMapKind, plainConfigMaps+1, ids)
	expectReconciledByOwner(g, logs, after)
	expectNoOverlap(g, logs)
	var during int
	for _, iv := range reconcilelog.Intervals(readReconcileLogs(g, logs), nil, time.Now()) {
		if iv.Start.After(start) {
			during++
		}
	}
	t.Logf("%s: settled again; %d reconciles since the restart began; ConfigMaps after the rolling update:\n%s", elapsed(), during, localrun.FormatCounts(after.Counts()))
}

// touchConfigMaps changes an annotation of one ConfigMap after the other,
// every 100 ms, so that each is reconciled again about every second, until
// the returned stop is called.
func touchConfigMaps(ctx context.Context, t *testing.T, namespace string, n int) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("object-%02d", i%n)}}
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"e2e.sharder.dev/touched":"%d"}}}`, i)
			if err := k8sClient.Patch(ctx, cm, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil && ctx.Err() == nil {
				t.Errorf("touching %s: %v", cm.Name, err)
				return
			}
		}
	}()
	stop = func() { cancel(); wg.Wait() }
	// Also when a failed step ends the test before it calls stop.
	t.Cleanup(stop)
	return stop
}
