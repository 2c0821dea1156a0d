package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// rolloutDrainTimeout is the plain controller's ring's drainTimeout while
// the sharder rolls: long enough for helm upgrade to replace the leader
// while every drain waits.
const rolloutDrainTimeout = time.Minute

// rolloutDrainSlack is how late a forced move may be released after its
// drain's timeout: the release is the new leader's next write once the
// deadline passes, seen through a watch.
const rolloutDrainSlack = 5 * time.Second

// testSharderRolloutKeepsDrains: the plain controller goes from 2 to 3 pods,
// so the sharder drains the ConfigMaps the new pod gets. Its agents cannot
// acknowledge, so each move is forced once the drain's timeout passes.
// While the drains wait, helm upgrade rolls the sharder's pods and another
// replica becomes leader. The new leader counts each drain's timeout from
// the start the old one wrote on the object: every drained ConfigMap is
// released within rolloutDrainSlack of its written start plus drainTimeout,
// not a drainTimeout after the new leader took over, and none is reconciled
// by two pods at once. It leaves the 3 pods running.
func testSharderRolloutKeepsDrains(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	ids2 := []string{plainName + "-0", plainName + "-1"}
	ids3 := []string{plainName + "-0", plainName + "-1", plainName + "-2"}
	waitStatefulSetReady(ctx, g, plainNamespace, plainName, 2)
	waitRingReady(ctx, g, plainRing, ids2)

	By(t, fmt.Sprintf("the plain controller's ring waits %s for a drain", rolloutDrainTimeout))
	var ring sharderv1alpha1.ControllerRing
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: plainRing}, &ring)).To(Succeed())
	previous := ring.Spec.DrainTimeout
	setDrainTimeout := func(ctx context.Context, d *metav1.Duration) error {
		var r sharderv1alpha1.ControllerRing
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: plainRing}, &r); err != nil {
			return err
		}
		patch := client.MergeFrom(r.DeepCopy())
		r.Spec.DrainTimeout = d
		return k8sClient.Patch(ctx, &r, patch)
	}
	g.Expect(setDrainTimeout(ctx, &metav1.Duration{Duration: rolloutDrainTimeout})).To(Succeed())
	// The ring as the example has it for the scenarios after this one; the
	// 3 pods stay, as the flow control scenario starts with 3.
	t.Cleanup(func() {
		if err := setDrainTimeout(context.Background(), previous); err != nil {
			t.Errorf("restoring the ring's drainTimeout: %v", err)
		}
	})
	gvr := corev1.SchemeGroupVersion.WithResource("configmaps")
	labels := newLabelRecorder(ctx, t, gvr, plainObjects, plainRing)
	tracker, err := localrun.NewLabelWatch(restConfig, gvr, plainObjects, plainRing)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tracker.Start(ctx)).To(Succeed())

	By(t, "scaled to 3 pods: the new pod's ConfigMaps are drained, each with its start")
	scaleStatefulSet(ctx, g, plainNamespace, plainName, 3)
	began := time.Now()
	starts := map[string]time.Time{}
	g.Eventually(func(g Gomega) {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(plainObjects))).To(Succeed())
		for _, m := range list.Items {
			if _, draining := m.Labels[sharderv1alpha1.DrainLabel(plainRing)]; !draining {
				continue
			}
			value, ok := m.Annotations[sharderv1alpha1.DrainStartedAnnotation(plainRing)]
			g.Expect(ok).To(BeTrue(), "%s is drained without its start", m.Name)
			start, ok := sharderv1alpha1.ParseDrainStarted(value)
			g.Expect(ok).To(BeTrue(), "%s: drain start %q", m.Name, value)
			starts[plainObjects+"/"+m.Name] = start
		}
		g.Expect(starts).NotTo(BeEmpty())
	}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	var latest time.Time
	for _, s := range starts {
		if s.After(latest) {
			latest = s
		}
	}
	t.Logf("%d ConfigMaps drained, %s after the scale-up", len(starts), time.Since(began).Round(100*time.Millisecond))

	By(t, "helm upgrade rolls the sharder's pods while the drains wait; another replica leads")
	leader := func(g Gomega) string {
		var l coordinationv1.Lease
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: sharderNamespace, Name: release}, &l)).To(Succeed())
		return ptr.Deref(l.Spec.HolderIdentity, "")
	}
	before := leader(g)
	// The first time another replica holds the leader's Lease, polled from
	// before the upgrade on: helm returns only once the new pods are ready,
	// which may be after the new leader took over.
	type takeover struct {
		at     time.Time
		holder string
	}
	electedAt := make(chan takeover, 1)
	go func() {
		_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, false, func(ctx context.Context) (bool, error) {
			// A failed read is read again at the next poll.
			var l coordinationv1.Lease
			read := k8sClient.Get(ctx, client.ObjectKey{Namespace: sharderNamespace, Name: release}, &l) == nil
			if h := ptr.Deref(l.Spec.HolderIdentity, ""); read && h != "" && h != before {
				electedAt <- takeover{at: time.Now(), holder: h}
				return true, nil
			}
			return false, nil
		})
	}()
	out, err := helm(ctx, "upgrade", release, filepath.Join(repoRoot, "charts", "sharder"), "--namespace", sharderNamespace, "--reuse-values",
		"--set-string", "podAnnotations.e2e\\.sharder\\.dev/rollout="+strconv.FormatInt(time.Now().Unix(), 10), "--wait", "--timeout", "3m")
	g.Expect(err).NotTo(HaveOccurred(), out)
	var first takeover
	g.Eventually(electedAt).WithTimeout(time.Minute).Should(Receive(&first), "another replica leads")
	elected := first.at
	t.Logf("leader %s after %s (was %s); the last drain started %s before", first.holder, elected.Sub(began).Round(100*time.Millisecond),
		before, elected.Sub(latest).Round(100*time.Millisecond))
	// Had the new leader restarted the timeouts, the releases would come a
	// drainTimeout after it took over: later than the slack allows.
	g.Expect(elected.Sub(latest)).To(BeNumerically(">", rolloutDrainSlack),
		"the new leader must take over well after the drains started for this check to tell the two apart")
	g.Expect(elected.Sub(latest)).To(BeNumerically("<", rolloutDrainTimeout-rolloutDrainSlack),
		"the sharder rolled after the drains had timed out: nothing was in flight")

	By(t, "each drained ConfigMap is released at its written start plus drainTimeout, then settles on the 3 pods")
	waitSettledWithin(ctx, t, tracker, plainConfigMaps+1, ids3, 2*time.Minute)
	for key, start := range starts {
		var released time.Time
		for _, c := range labels.changesSince(key, began) {
			if c.Instance == "" && c.Drain != "" {
				released = c.At
				break
			}
		}
		g.Expect(released.IsZero()).To(BeFalse(), "%s was never seen released: %v", key, labels.changesSince(key, began))
		deadline := start.Add(rolloutDrainTimeout)
		g.Expect(released).To(BeTemporally(">=", deadline.Add(-time.Second)), "%s released before its drain timed out", key)
		g.Expect(released).To(BeTemporally("<=", deadline.Add(rolloutDrainSlack)),
			"%s released %s after its drain timed out (the new leader took over %s after the drain began)",
			key, released.Sub(deadline).Round(100*time.Millisecond), elected.Sub(start).Round(100*time.Millisecond))
	}
	expectNoOverlap(g, plainLogs)
}
