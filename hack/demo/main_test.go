package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// demoClusters is the number of EtcdClusters of a test run: fewer than the
// command's hundred, enough for every instance to get some.
const demoClusters = 40

// TestDemo runs the demo's story on a local control plane in each unit, as
// make demo and make demo UNIT=slots run it, and checks it against what this
// test reads from the API server itself just before the fourth instance
// starts and once the demo found the ring settled again, then checks that
// the demo reported what the test saw.
func TestDemo(t *testing.T) {
	ctrllog.SetLogger(logr.Discard()) // as main does
	t.Run("labels", func(t *testing.T) { runDemo(t, unitLabels, checkLabelJoin) })
	t.Run("slots", func(t *testing.T) { runDemo(t, unitSlots, checkSlotJoin) })
}

// A check checks a join while the control plane runs and returns the check
// of the demo's output, run once the demo is done.
type check func(g *gomega.WithT, j *join) (report func(output string))

// snapshot is what the test read of the ring and its EtcdClusters.
type snapshot struct {
	ring     *sharderv1alpha1.ControllerRing
	clusters map[string]metav1.PartialObjectMetadata
}

// join is what a check gets: the API server's client, the snapshots around
// the join and the demo's folder.
type join struct {
	ctx           context.Context
	c             client.Client
	before, after snapshot
	dir           string
}

func runDemo(t *testing.T, unit string, check check) {
	g := gomega.NewWithT(t)
	var buf lockedBuffer
	saved := out
	out = &buf
	t.Cleanup(func() {
		out = saved
		if t.Failed() {
			t.Logf("the demo's output:\n%s", buf.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	j := &join{ctx: ctx, dir: t.TempDir()}
	scheme := localrun.Scheme()
	g.Expect(etcdv1alpha1.AddToScheme(scheme)).To(gomega.Succeed())
	var report func(string)
	err := run(ctx, options{dir: j.dir, clusters: demoClusters, leaseDuration: 5 * time.Second, unit: unit, hooks: hooks{
		started: func(cfg *rest.Config) (err error) {
			j.c, err = client.New(cfg, client.Options{Scheme: scheme})
			return err
		},
		joining: func() (err error) {
			j.before, err = read(ctx, j.c)
			return err
		},
		joined: func() (err error) {
			if j.after, err = read(ctx, j.c); err != nil {
				return err
			}
			report = check(g, j)
			return nil
		},
	}})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	g.Expect(report).NotTo(gomega.BeNil(), "the demo never reached the end of the join")
	report(buf.String())
}

// read reads the example's ring and the EtcdClusters' metadata.
func read(ctx context.Context, c client.Client) (snapshot, error) {
	s := snapshot{ring: &sharderv1alpha1.ControllerRing{}, clusters: map[string]metav1.PartialObjectMetadata{}}
	if err := c.Get(ctx, client.ObjectKey{Name: operatorRing}, s.ring); err != nil {
		return s, err
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(etcdv1alpha1.GroupVersion.WithKind("EtcdClusterList"))
	if err := c.List(ctx, list, client.InNamespace(demoNamespace)); err != nil {
		return s, err
	}
	for _, m := range list.Items {
		s.clusters[m.Name] = m
	}
	return s, nil
}

var (
	threeInstances = []string{"etcd-operator-0", "etcd-operator-1", "etcd-operator-2"}
	fourInstances  = append(threeInstances[:3:3], "etcd-operator-3")
)

// checkLabelJoin: before, every EtcdCluster is on one of the three
// instances, none draining; after, on one of the four, the fourth has some,
// every cluster that moved went to it; the shard label is guarded; and the
// demo reports how many moved.
func checkLabelJoin(g *gomega.WithT, j *join) func(string) {
	shard := sharderv1alpha1.ShardLabel(operatorRing)
	moved := 0
	for name, b := range j.before.clusters {
		g.Expect(threeInstances).To(gomega.ContainElement(b.Labels[shard]), "%s before the join", name)
		g.Expect(drain.Requested(&b, operatorRing)).To(gomega.BeFalse(), "%s draining before the join", name)
		a := j.after.clusters[name]
		g.Expect(fourInstances).To(gomega.ContainElement(a.Labels[shard]), "%s after the join", name)
		g.Expect(drain.Requested(&a, operatorRing)).To(gomega.BeFalse(), "%s draining after the join", name)
		if a.Labels[shard] != b.Labels[shard] {
			moved++
			g.Expect(a.Labels[shard]).To(gomega.Equal("etcd-operator-3"), "%s moved from %s, not to the new instance", name, b.Labels[shard])
		}
	}
	g.Expect(j.after.clusters).To(gomega.HaveLen(demoClusters))
	g.Expect(moved).To(gomega.BeNumerically(">", 0), "no cluster moved to the fourth instance")
	// The webhook denies a hand-made change of the shard label, as the
	// demo's instructions say.
	g.Eventually(func() error {
		obj := j.cluster(g, clusterName(0))
		obj.Labels[shard] = "someone-else"
		return j.c.Update(j.ctx, obj, client.DryRunAll)
	}).WithTimeout(time.Minute).Should(gomega.Satisfy(denied), "the shard label is not protected")
	return func(output string) {
		g.Expect(output).To(gomega.ContainSubstring("%d of %d clusters moved (ideal: a quarter, %d)", moved, demoClusters, demoClusters/4))
	}
}

// denied reports whether an admission check refused a request.
func denied(err error) bool { return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) }

// checkSlotJoin: before, the slot table grants every slot to one of the
// three instances, none releasing; after, to one of the four, the fourth
// holds its share, every slot that moved went to it; each EtcdCluster's
// slot label is the slot of its key and did not change; no EtcdCluster was
// written during the join (its resourceVersion is the same); the fourth
// instance reconciled the clusters of its slots; the slot label is guarded;
// and the demo reports the slots moved, the clusters in them and that
// nothing was written.
func checkSlotJoin(g *gomega.WithT, j *join) func(string) {
	ring := j.after.ring
	g.Expect(ring.Spec.AssignsSlots()).To(gomega.BeTrue())
	count := ring.Spec.EffectiveSlotCount()
	tableOf := func(s snapshot) slots.Table {
		tb, err := slots.FromStatus(count, s.ring.Status.Slots)
		g.Expect(err).NotTo(gomega.HaveOccurred())
		return tb
	}
	before, after := tableOf(j.before), tableOf(j.after)
	g.Expect(tableSettled(before, threeInstances)).To(gomega.Succeed(), "the table before the join")
	g.Expect(tableSettled(after, fourInstances)).To(gomega.Succeed(), "the table after the join")
	g.Expect(after.Revision).To(gomega.BeNumerically(">", before.Revision))
	movedSlots := map[int]bool{}
	for i := range after.Slots {
		g.Expect(before.Slots[i].Holder).NotTo(gomega.BeEmpty(), "slot %d unassigned before the join", i)
		if after.Slots[i].Holder != before.Slots[i].Holder {
			g.Expect(after.Slots[i].Holder).To(gomega.Equal("etcd-operator-3"), "slot %d moved from %s, not to the new instance", i, before.Slots[i].Holder)
			movedSlots[i] = true
		}
	}
	granted, _ := after.HeldBy("etcd-operator-3")
	g.Expect(granted).To(gomega.HaveLen(len(movedSlots)))
	g.Expect(len(granted)).To(gomega.BeNumerically(">=", count/4), "the fourth instance holds less than its share")

	label := sharderv1alpha1.SlotLabel(operatorRing)
	var inMoved []string
	for name, b := range j.before.clusters {
		a, ok := j.after.clusters[name]
		g.Expect(ok).To(gomega.BeTrue(), "%s gone after the join", name)
		g.Expect(b.Labels[label]).To(gomega.Equal(strconv.Itoa(slotOf(ring, name))), "%s: its slot label is not the slot of its key", name)
		g.Expect(a.Labels[label]).To(gomega.Equal(b.Labels[label]), "%s: its slot label changed", name)
		g.Expect(a.Labels).NotTo(gomega.HaveKey(sharderv1alpha1.ShardLabel(operatorRing)), "%s has a shard label in slot mode", name)
		g.Expect(a.ResourceVersion).To(gomega.Equal(b.ResourceVersion), "%s was written during the join", name)
		if movedSlots[slotOf(ring, name)] {
			inMoved = append(inMoved, name)
		}
	}
	g.Expect(j.after.clusters).To(gomega.HaveLen(demoClusters))
	g.Expect(inMoved).NotTo(gomega.BeEmpty(), "no EtcdCluster is in the slots that moved")
	// The fourth instance reconciled each of them, by its reconcile log.
	entries, err := reconcilelog.Read(filepath.Join(j.dir, "reconciles", "etcd-operator-3.jsonl"))
	g.Expect(err).NotTo(gomega.HaveOccurred())
	reconciled := map[string]bool{}
	for _, e := range entries {
		if e.Phase == reconcilelog.PhaseEnd && e.Error == "" {
			reconciled[e.Object] = true
		}
	}
	for _, name := range inMoved {
		g.Expect(reconciled).To(gomega.HaveKey(demoNamespace+"/"+name), "etcd-operator-3 did not reconcile %s", name)
	}

	// The policy denies a change of the slot label, as the demo's
	// instructions say, even to a cluster administrator.
	g.Eventually(func() error {
		obj := j.cluster(g, clusterName(0))
		obj.Labels[label] = strconv.Itoa((slotOf(ring, clusterName(0)) + 1) % count)
		return j.c.Update(j.ctx, obj, client.DryRunAll)
	}).WithTimeout(time.Minute).Should(gomega.Satisfy(denied), "the slot label is not protected")
	return func(output string) { checkSlotReport(g, output, before, after, len(movedSlots), len(inMoved)) }
}

// checkSlotReport: the demo reports the slots moved and the table writes,
// the clusters in the moved slots, that no EtcdCluster was written, and the
// slot table of each instance.
func checkSlotReport(g *gomega.WithT, output string, before, after slots.Table, moved, inMoved int) {
	count := len(after.Slots)
	g.Expect(output).To(gomega.ContainSubstring("%d of %d slots moved (ideal: a quarter, %d), all to etcd-operator-3, in %d writes of the slot table (revision %d → %d)",
		moved, count, count/4, after.Revision-before.Revision, before.Revision, after.Revision))
	g.Expect(output).To(gomega.ContainSubstring("%d of %d EtcdClusters are in those slots", inMoved, demoClusters))
	g.Expect(output).To(gomega.ContainSubstring("no EtcdCluster was written: the resourceVersions of all %d are those they had before the join", demoClusters))
	for _, id := range fourInstances {
		g.Expect(output).To(gomega.MatchRegexp(`(?m)^\s+%s\s+\d+\s+\d+\s+[0-9,-]+\s+-$`, id), "the slot table shows no line for %s", id)
	}
}

// cluster reads the EtcdCluster name.
func (j *join) cluster(g *gomega.WithT, name string) *etcdv1alpha1.EtcdCluster {
	obj := &etcdv1alpha1.EtcdCluster{}
	g.Expect(j.c.Get(j.ctx, client.ObjectKey{Namespace: demoNamespace, Name: name}, obj)).To(gomega.Succeed())
	return obj
}

// lockedBuffer is the demo's output, written by the demo and read by the
// test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
