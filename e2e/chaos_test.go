package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// ChaosInput configures ChaosSpec.
type ChaosInput struct {
	// Seed makes the schedule repeatable: which instance each fault hits,
	// how long it lasts, the object operations in between.
	Seed uint64
	// Rounds is how often each fault is injected.
	Rounds int
	// Instances and Objects at the start.
	Instances, Objects int
	// Outage bounds how long the API server is down, and how long one
	// instance is cut off (min, max).
	Outage [2]time.Duration
	// Interval between two object operations while a fault lasts.
	Interval time.Duration
	// Slots, when positive, makes the ring one of unit Slots with that many
	// slots: an object's instance is the holder of its slot in the ring's
	// table. Default: 0, a ring of unit Objects.
	Slots int
	// Faults, when set, are the names of the faults to inject; the others
	// are left out. Default: every fault.
	Faults []string
}

// chaosFault is one kind of infrastructure fault: inject starts it and
// returns what ends it.
type chaosFault struct {
	name   string
	inject func(c *chaos) (end func())
}

// chaosRow is what one fault did over all its rounds.
type chaosRow struct {
	rounds, overlaps, orphans, lost int
	// worst is the longest time from the end of one of its rounds until
	// every object sat on a live instance again.
	worst time.Duration
}

// chaos is the fault-injection suite's world: a ring whose sharder replicas
// and instances each reach the API server through a FaultProxy of their
// own, so that one process or all of them can be cut off, and the admin
// client (the test's object writes and its label tracker) directly.
type chaos struct {
	e       *ringEnv
	in      ChaosInput
	rng     *rand.Rand
	proxies map[string]*localrun.FaultProxy
	// alive are the names of the EtcdClusters the test created and has not
	// deleted.
	alive   map[string]bool
	created int
	// extra counts the instances started by rebalances, next names the
	// next one; skewed counts those started with a skewed clock.
	extra, next, skewed int
	// slots follows the ring's table and the objects' slots in a ring of
	// unit Slots; nil in a ring of unit Objects.
	slots *slotWatch
}

// owners returns the instance each tracked object is assigned to: its
// shard label's, or in a ring of unit Slots the holder of its slot in the
// latest table ("" when none).
func (c *chaos) owners() map[string]string {
	out := map[string]string{}
	if c.slots != nil {
		for _, o := range c.slots.objects() {
			out[o.key] = o.holder
		}
		return out
	}
	for _, o := range c.e.tracker.Snapshot() {
		out[o.Key] = o.Instance
	}
	return out
}

// waitSettled waits until the n objects are assigned as the ring wants
// them over the live instances.
func (c *chaos) waitSettled(n int, timeout time.Duration) {
	if c.slots != nil {
		c.slots.waitSettled(n, timeout, c.e.liveInstances()...)
		return
	}
	c.e.waitSettled(n, timeout, c.e.liveInstances()...)
}

// ChaosSpec runs the churn of ChurnSpec while a seeded schedule injects
// infrastructure faults, each Rounds times: the API server down, and
// restarted after etcd was compacted; the sharder's leader frozen (SIGSTOP)
// for longer than its lease while a rebalance runs; one instance cut off,
// slowed, or losing its connections; every instance killed at once; an
// instance whose clock is skewed. After
// each round it counts overlapping reconciles (two instances on one object
// at once), orphans (objects still not on a live instance 2d + 10s after
// the fault ended) and objects lost (created and not deleted, yet missing
// or never reconciled), and fails unless all are zero.
func ChaosSpec(t *testing.T, in ChaosInput) map[string]*chaosRow {
	e := newRingEnv(t, ringOptions{Slots: in.Slots})
	c := &chaos{e: e, in: in, rng: rand.New(rand.NewPCG(in.Seed, in.Seed^0x5eed)), proxies: map[string]*localrun.FaultProxy{},
		alive: map[string]bool{}, next: in.Instances}
	if in.Slots > 0 {
		c.slots = newSlotWatch(e, in.Slots)
	}
	t.Cleanup(func() {
		for _, p := range c.proxies {
			_ = p.Close()
		}
	})
	for i := range in.Instances {
		c.launchInstance(fmt.Sprintf("instance-%d", i))
	}
	for i := range in.Instances {
		id := fmt.Sprintf("instance-%d", i)
		e.waitHeld(id, e.instance(id))
	}
	for i := range 2 {
		c.startSharder(fmt.Sprintf("%s-sharder-%d", e.ring, i))
	}
	e.leader()
	for _, k := range e.createClusters("obj", in.Objects) {
		c.alive[k[len(e.namespace)+1:]] = true
	}
	c.created = in.Objects
	c.waitSettled(in.Objects, 2*time.Minute)

	var faults []chaosFault
	for _, f := range c.faults() {
		if len(in.Faults) == 0 || slices.Contains(in.Faults, f.name) {
			faults = append(faults, f)
		}
	}
	if len(faults) == 0 {
		t.Fatalf("no fault named %v", in.Faults)
	}
	rows := map[string]*chaosRow{}
	var schedule []chaosFault
	for range in.Rounds {
		schedule = append(schedule, faults...)
	}
	c.rng.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	seenOverlaps := 0
	d := e.opts.LeaseDuration
	for i, f := range schedule {
		row := rows[f.name]
		if row == nil {
			row = &chaosRow{}
			rows[f.name] = row
		}
		row.rounds++
		t.Logf("chaos round %d/%d: %s", i+1, len(schedule), f.name)
		end := f.inject(c)
		end()
		ended := time.Now()
		took, orphans := c.waitOwned(2*d + 10*time.Second)
		row.orphans += orphans
		if orphans > 0 {
			t.Errorf("round %d (%s): %d objects not on a live instance %v after the fault ended", i+1, f.name, orphans, 2*d+10*time.Second)
			took, orphans = c.waitOwned(2 * time.Minute)
			if orphans > 0 {
				t.Fatalf("round %d (%s): %d objects still not on a live instance after two minutes", i+1, f.name, orphans)
			}
		}
		row.worst = max(row.worst, took)
		c.waitSettled(len(c.alive), 2*time.Minute)
		if lost := c.lost(); len(lost) > 0 {
			row.lost += len(lost)
			t.Errorf("round %d (%s): objects lost: %v", i+1, f.name, lost)
		}
		overlaps := reconcilelog.Overlaps(e.intervals())
		if n := len(overlaps) - seenOverlaps; n > 0 {
			row.overlaps += n
			for _, o := range overlaps[seenOverlaps:] {
				t.Errorf("round %d (%s): %s", i+1, f.name, o.String())
			}
			seenOverlaps = len(overlaps)
		}
		t.Logf("chaos round %d/%d: %s: every object on a live instance %v after the fault ended, settled %v after",
			i+1, len(schedule), f.name, took.Round(time.Millisecond), time.Since(ended).Round(time.Millisecond))
	}
	if c.slots != nil {
		c.slots.expectReconciledByHolder(2 * time.Minute)
		if bad := c.slots.violations(); len(bad) > 0 {
			t.Errorf("slot tables the sharder must never write: %v", bad)
		}
	} else {
		e.expectReconciledByOwner(2 * time.Minute)
	}
	names := make([]string, 0, len(rows))
	for name := range rows {
		names = append(names, name)
	}
	sort.Strings(names)
	var report strings.Builder
	fmt.Fprintf(&report, "| fault | rounds | overlapping objects | orphans | objects lost | longest time to every object on a live instance |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, name := range names {
		r := rows[name]
		fmt.Fprintf(&report, "| %s | %d | %d | %d | %d | %v |\n", name, r.rounds, r.overlaps, r.orphans, r.lost, r.worst.Round(100*time.Millisecond))
	}
	t.Logf("chaos (seed %d, %d objects created, instances now %v, restarted %v):\n%s", in.Seed, c.created, e.liveInstances(), e.restartCounts(), report.String())
	if path := os.Getenv("SHARDER_CHAOS_REPORT"); path != "" {
		// Each unit's table in turn, appended: `make chaos` runs both.
		unit := sharderv1alpha1.AssignmentUnitObjects
		if in.Slots > 0 {
			unit = sharderv1alpha1.AssignmentUnitSlots
		}
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			_, err = fmt.Fprintf(f, "Unit %s (seed %d, %d rounds of each fault):\n\n%s\n", unit, in.Seed, in.Rounds, report.String())
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Errorf("writing the report: %v", err)
		}
	}
	return rows
}

// faults returns the faults the suite injects.
func (c *chaos) faults() []chaosFault {
	e := c.e
	return []chaosFault{
		{"API server down", func(c *chaos) func() {
			for _, p := range c.proxies {
				p.Set(localrun.Refuse, 0)
			}
			c.churnFor(c.outage())
			return func() {
				for _, p := range c.proxies {
					p.Set(localrun.Pass, 0)
				}
			}
		}},
		{"etcd compacted, API server restarted", func(c *chaos) func() {
			c.churnFor(2 * time.Second)
			c.compact()
			for _, p := range c.proxies {
				p.Reset()
			}
			c.churnFor(2 * time.Second)
			return func() {}
		}},
		{"leader frozen during a rebalance", func(c *chaos) func() {
			leader := e.leader()
			e.g.Expect(leader.Signal(syscall.SIGSTOP)).To(gomega.Succeed())
			c.rebalance()
			// Longer than the leader's lease (localrun's 4s) plus 5s.
			c.churnFor(9 * time.Second)
			return func() { _ = leader.Signal(syscall.SIGCONT) }
		}},
		{"one instance cut off", func(c *chaos) func() {
			p := c.proxies[c.pick()]
			p.Set(localrun.Blackhole, 0)
			c.churnFor(c.outage())
			return func() { p.Set(localrun.Pass, 0) }
		}},
		{"one instance slowed by 300ms", func(c *chaos) func() {
			p := c.proxies[c.pick()]
			p.Set(localrun.Delay, 300*time.Millisecond)
			c.churnFor(10 * time.Second)
			return func() { p.Set(localrun.Pass, 0) }
		}},
		{"one instance's connections dropped", func(c *chaos) func() {
			p := c.proxies[c.pick()]
			p.Set(localrun.Refuse, 0)
			c.churnFor(4 * time.Second)
			return func() { p.Set(localrun.Pass, 0) }
		}},
		{"an instance's clock skewed by 2.5 lease durations", func(c *chaos) func() {
			// A new instance whose wall clock runs ahead or lags: the
			// times it writes on its Lease are off by more than twice the
			// lease duration, which decides nothing.
			offset := 5 * e.opts.LeaseDuration / 2
			if c.rng.IntN(2) == 0 {
				offset = -offset
			}
			id := fmt.Sprintf("skewed-%d", c.skewed)
			c.skewed++
			c.launchInstance(id, "--clock-offset", offset.String())
			e.waitHeld(id, e.instance(id))
			c.churnFor(3 * e.opts.LeaseDuration)
			return func() { e.g.Expect(e.instance(id).Stop(30 * time.Second)).To(gomega.Succeed()) }
		}},
		{"Lease deleted with its process, back while the objects move", func(c *chaos) func() {
			// A force-deleted pod whose Lease the garbage collector removes:
			// the process is gone for good, its Lease too, and a new process
			// with the same ID starts once its objects may begin to move
			// (2d after its last renewal), while they are being moved.
			id := c.pick()
			e.g.Expect(e.instance(id).Kill()).To(gomega.Succeed())
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: e.leaseNamespace, Name: id}}
			e.g.Expect(client.IgnoreNotFound(e.c.Delete(e.ctx, lease))).To(gomega.Succeed())
			c.churnFor(2*e.opts.LeaseDuration + e.opts.LeaseDuration/4)
			c.launchInstance(id)
			c.churnFor(2 * e.opts.LeaseDuration)
			return func() {}
		}},
		{"every instance killed", func(c *chaos) func() {
			for _, id := range e.liveInstances() {
				_ = e.instance(id).Signal(syscall.SIGKILL) // restarted, as crashed containers are
			}
			c.churnFor(2 * time.Second)
			return func() {}
		}},
	}
}

// outage returns how long the next outage lasts.
func (c *chaos) outage() time.Duration {
	lo, hi := c.in.Outage[0], c.in.Outage[1]
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)))
}

// pick returns a live instance.
func (c *chaos) pick() string {
	ids := c.e.liveInstances()
	return ids[c.rng.IntN(len(ids))]
}

// rebalance changes the ring's membership: it starts one instance more,
// or stops the last one it started.
func (c *chaos) rebalance() {
	if c.extra > 0 {
		id := fmt.Sprintf("instance-%d", c.next-1)
		go func() { _ = c.e.instance(id).Stop(30 * time.Second) }()
		c.extra--
		c.next--
		return
	}
	c.launchInstance(fmt.Sprintf("instance-%d", c.next))
	c.extra++
	c.next++
}

// churnFor creates, changes and deletes EtcdClusters for d.
func (c *chaos) churnFor(d time.Duration) {
	e := c.e
	tick := time.NewTicker(c.in.Interval)
	defer tick.Stop()
	for start := time.Now(); time.Since(start) < d; <-tick.C {
		names := make([]string, 0, len(c.alive))
		for n := range c.alive {
			names = append(names, n)
		}
		slices.Sort(names)
		// Creations and deletions keep the number of objects between half
		// and twice Objects: each object's client Service holds one of the
		// API server's few ClusterIPs, and no controller manager collects
		// those of deleted objects here.
		switch op := c.rng.IntN(10); {
		case len(names) <= c.in.Objects/2 || (op < 3 && len(names) < 2*c.in.Objects):
			name := fmt.Sprintf("obj-%03d", c.created)
			c.created++
			e.g.Expect(e.c.Create(e.ctx, e.newCluster(name))).To(gomega.Succeed())
			c.alive[name] = true
		case op < 8 && len(names) < 2*c.in.Objects:
			name := names[c.rng.IntN(len(names))]
			patch := fmt.Appendf(nil, `{"spec":{"advanced":{"etcdConfig":{"snapshot-count":"%d"}}}}`, 10000+c.rng.IntN(90000))
			e.g.Expect(ignoreGone(e.c.Patch(e.ctx, e.newCluster(name), client.RawPatch(types.MergePatchType, patch)))).To(gomega.Succeed())
		default:
			name := names[c.rng.IntN(len(names))]
			e.g.Expect(ignoreGone(e.c.Delete(e.ctx, e.newCluster(name)))).To(gomega.Succeed())
			delete(c.alive, name)
			svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: name + "-client"}}
			e.g.Expect(ignoreGone(e.c.Delete(e.ctx, svc))).To(gomega.Succeed())
		}
	}
}

// compact compacts etcd's history up to its current revision: clients
// that resume a watch from before it are answered 410 Gone once the API
// server's watch cache no longer holds their resourceVersion.
func (c *chaos) compact() {
	e := c.e
	etcd, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{cluster.ControlPlane.Env.Environment.ControlPlane.Etcd.URL.String()},
		DialTimeout: 5 * time.Second,
	})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	defer etcd.Close()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	resp, err := etcd.Get(ctx, "compact-probe")
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	_, err = etcd.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
}

// waitOwned waits up to timeout until every tracked object is assigned to
// an instance that is live and holds its Lease; it returns how long that
// took and how many objects were not, at the end.
func (c *chaos) waitOwned(timeout time.Duration) (time.Duration, int) {
	e := c.e
	start := time.Now()
	missing := 0
	for {
		live := map[string]bool{}
		for _, id := range e.liveInstances() {
			var l coordinationv1.Lease
			if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.leaseNamespace, Name: id}, &l); err == nil &&
				ptr.Deref(l.Spec.HolderIdentity, "") == id && e.instance(id).Running() {
				live[id] = true
			}
		}
		missing = 0
		for _, owner := range c.owners() {
			if !live[owner] {
				missing++
			}
		}
		if missing == 0 || time.Since(start) >= timeout {
			return time.Since(start), missing
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lost returns the objects created and not deleted that are missing, and
// those present that were deleted.
func (c *chaos) lost() []string {
	present := map[string]bool{}
	for key := range c.owners() {
		present[key[len(c.e.namespace)+1:]] = true
	}
	var out []string
	for name := range c.alive {
		if !present[name] {
			out = append(out, name+" missing")
		}
	}
	for name := range present {
		if !c.alive[name] {
			out = append(out, name+" deleted yet present")
		}
	}
	sort.Strings(out)
	return out
}

// kubeconfig returns a kubeconfig for process name that reaches the API
// server through a FaultProxy of its own, made from the kubeconfig file
// src.
func (c *chaos) kubeconfig(name, src string) string {
	e := c.e
	u, err := url.Parse(cluster.ControlPlane.Config.Host)
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	p, err := localrun.NewFaultProxy(u.Host)
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	c.proxies[name] = p
	dst := filepath.Join(cluster.Dir, e.ring, name+".kubeconfig")
	e.g.Expect(localrun.WriteProxiedKubeconfig(src, dst, u.Host, p)).To(gomega.Succeed())
	return dst
}

// launchInstance starts an operator instance that reaches the API server
// through its own proxy, with extraArgs added to its command line.
func (c *chaos) launchInstance(id string, extraArgs ...string) {
	e := c.e
	args := append(operatorArgs(e, id, e.opts.LeaseDuration), extraArgs...)
	i := slices.Index(args, "--kubeconfig")
	args[i+1] = c.kubeconfig(id, args[i+1])
	p, err := cluster.Start(localrun.ProcessOptions{
		Name: e.ring + "-" + id, Path: cluster.Binaries.Operator, Args: args,
		Env:     []string{"POD_NAME=" + id, "POD_NAMESPACE=" + e.leaseNamespace},
		Restart: instanceRestart,
	})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.procs.Add(p)
	e.setInstance(id, p)
}

// startSharder starts a sharder replica that reaches the API server
// through its own proxy.
func (c *chaos) startSharder(name string) {
	e := c.e
	s, err := cluster.StartSharder(e.ctx, localrun.SharderOptions{Name: name, Namespace: e.sharderNamespace, Restart: instanceRestart,
		Kubeconfig: c.kubeconfig(name, cluster.SharderUser.Kubeconfig)})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.procs.Add(s.Process)
	e.mu.Lock()
	e.sharders = append(e.sharders, s)
	e.mu.Unlock()
}

// envInt reads a positive integer from the environment, else def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestChaos is the fault-injection suite's short form: each fault once,
// outages of a few seconds. `make chaos` runs the long form
// (SHARDER_CHAOS_ROUNDS rounds of each, outages of 30–90s).
func TestChaos(t *testing.T) {
	in := ChaosInput{Seed: 1, Rounds: 1, Instances: 3, Objects: 40, Outage: [2]time.Duration{5 * time.Second, 8 * time.Second},
		Interval: 100 * time.Millisecond}
	if os.Getenv("SHARDER_CHAOS_LONG") != "" {
		in.Rounds = envInt("SHARDER_CHAOS_ROUNDS", 3)
		in.Seed = uint64(envInt("SHARDER_CHAOS_SEED", 1))
		in.Outage = [2]time.Duration{30 * time.Second, 90 * time.Second}
	}
	ChaosSpec(t, in)
}

// TestChaosSlots is the fault-injection suite on a ring of unit Slots. Its
// short form injects the faults that reach slot mode's own paths (a Lease
// deleted with its process and back while its slots move, the leader
// frozen while slots move, every instance killed at once); `make chaos`
// runs every fault, as for TestChaos.
func TestChaosSlots(t *testing.T) {
	in := ChaosInput{Seed: 2, Rounds: 1, Instances: 3, Objects: 40, Outage: [2]time.Duration{5 * time.Second, 8 * time.Second},
		Interval: 100 * time.Millisecond, Slots: 64, Faults: []string{
			"Lease deleted with its process, back while the objects move",
			"leader frozen during a rebalance",
			"every instance killed",
		}}
	if os.Getenv("SHARDER_CHAOS_LONG") != "" {
		in.Rounds = envInt("SHARDER_CHAOS_ROUNDS", 3)
		in.Seed = uint64(envInt("SHARDER_CHAOS_SEED", 1)) + 1
		in.Outage = [2]time.Duration{30 * time.Second, 90 * time.Second}
		in.Faults = nil
	}
	ChaosSpec(t, in)
}
