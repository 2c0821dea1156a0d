package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// The slots mode's measured membership changes and memory figures.

// change measures one membership change: do starts it; the window ends
// once the ring settled, plus slotGrace.
func (s *slotsRun) change(ctx context.Context, name string, do func() error, settleTimeout time.Duration) (slotWindow, []handOver, time.Duration, time.Duration, error) {
	before, _ := s.rec.latestTable()
	cpu0, err := cpuTime(s.sharder.Pid())
	if err != nil {
		return slotWindow{}, nil, 0, 0, err
	}
	t0 := time.Now()
	if err := do(); err != nil {
		return slotWindow{}, nil, 0, 0, err
	}
	if err := s.waitSettled(ctx, settleTimeout); err != nil {
		return slotWindow{}, nil, 0, 0, fmt.Errorf("%s: %w", name, err)
	}
	settled := time.Since(t0)
	after, _ := s.rec.latestTable()
	var moves []slotMove
	for _, m := range movedSlots(before.table, after.table) {
		if s.occupied[m.slot].Load() > 0 {
			moves = append(moves, m)
		}
	}
	// The new holders' first reconciles may come after the table settled
	// (their lists): wait for them, a minute at most (the report counts
	// the slots never reconciled).
	_ = localrun.Poll(ctx, time.Minute, 50*time.Millisecond, func() error {
		for _, m := range moves {
			if s.rec.firstReconcile(m.to, m.slot, t0).IsZero() {
				return fmt.Errorf("slot %d not reconciled by %s yet", m.slot, m.to)
			}
		}
		return nil
	})
	if err := sleep(ctx, slotGrace); err != nil {
		return slotWindow{}, nil, 0, 0, err
	}
	cpu1, err := cpuTime(s.sharder.Pid())
	if err != nil {
		return slotWindow{}, nil, 0, 0, err
	}
	w := s.rec.window(t0, time.Now())
	hs := handOvers(moves, w.tables, w.acksSeen, s.rec.firstReconcile)
	return w, hs, settled, cpu1 - cpu0, nil
}

// addChange reports one change's writes, hand-overs and CPU. list is the
// time of the new holder's list of its granted slots (the target allows
// it besides targetSlotHandOver), 0 when not measured.
func (s *slotsRun) addChange(what string, w slotWindow, hs []handOver, settled, cpu, list time.Duration, load string) {
	writes := w.ringWrites + w.leaseWrites - w.acks
	s.add(fmt.Sprintf("%s: object writes", what), fmt.Sprintf("**%d**", w.objectWrites), "", "0", w.objectWrites == 0)
	s.add("  ring status writes + Lease writes other than renewals and acknowledgements (ring + Lease); acknowledgements besides",
		fmt.Sprintf("**%d** (%d + %d); %d", writes, w.ringWrites, w.leaseWrites-w.acks, w.acks), "", fmt.Sprintf("≤ %d", targetSlotWrites), writes <= targetSlotWrites)
	s.add("  slots moved (with objects); settled after (every slot granted, records match)", fmt.Sprintf("%d; %s", len(hs), seconds(settled)), "", "", true)
	if acked, missing := latencies(hs, true); len(acked)+missing > 0 {
		ok := missing == 0 && quantile(acked, 1) <= targetSlotHandOver+list
		target := "≤ " + seconds(targetSlotHandOver)
		if list > 0 {
			target += " + its list (" + millis(list) + ", below)"
		}
		s.add("  old holder's acknowledgement → new holder's first reconcile of the slot (list included): median, max",
			fmt.Sprintf("**%s**, **%s**%s; load %s", millis(quantile(acked, 0.5)), millis(quantile(acked, 1)), missingNote(missing), load), "", target, ok)
	}
	if granted, missing := latencies(hs, false); len(granted)+missing > 0 {
		s.add("  slots with no acknowledgement (holder gone): grant → new holder's first reconcile, median, max",
			fmt.Sprintf("%s, %s%s", millis(quantile(granted, 0.5)), millis(quantile(granted, 1)), missingNote(missing)), "", "", true)
	}
	s.add("  sharder CPU for the change (until settled and every moved slot reconciled, + "+seconds(slotGrace)+")", fmt.Sprintf("%s; load %s", seconds(cpu), load), "", "", true)
}

func missingNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d slots never reconciled)", n)
}

// scaleOut adds one instance.
func (s *slotsRun) scaleOut(ctx context.Context) error {
	n := len(s.live())
	id := instanceID(n)
	w, hs, settled, cpu, err := s.change(ctx, "scale-out", func() error { return s.startInstance(ctx, id, leaseholder.ReleaseStop) }, 3*time.Minute)
	if err != nil {
		return err
	}
	s.added = id
	load := loadAverage()
	l, err := s.groupLists(ctx, id)
	if err != nil {
		return err
	}
	s.addChange(fmt.Sprintf("scale-out %d → %d instances (%d objects)", n, n+1, s.total), w, hs, settled, cpu, quantile(l.batch, 0.5), load)
	s.add(fmt.Sprintf("  after it, one LIST of all of %s's slots (as its slot cache lists the groups it starts together; %d objects), 3 tries: median, max", id, l.batchItems),
		fmt.Sprintf("%s, %s; load %s", millis(quantile(l.batch, 0.5)), millis(quantile(l.batch, 1)), l.load), "", "", true)
	s.add(fmt.Sprintf("  one LIST per watch group of %s's slots (label selector, as a slot cache lists a group it starts alone; %d groups, %d objects per list on average): median, max", id, len(l.perGroup), l.groupItems/max(len(l.perGroup), 1)),
		fmt.Sprintf("%s, %s; load %s", millis(quantile(l.perGroup, 0.5)), millis(quantile(l.perGroup, 1)), l.load), "", "", true)
	return nil
}

// listTimes are the times of the lists of an instance's granted slots.
type listTimes struct {
	batch, perGroup        []time.Duration // sorted
	batchItems, groupItems int
	load                   string
}

// groupLists times, after the change, one LIST of all of the instance's
// granted slots, as its slot cache lists the groups it starts together
// (the list part of a hand-over), three times; and one LIST per watch
// group of those slots with the group's label selector, as the cache lists
// a group it starts alone.
func (s *slotsRun) groupLists(ctx context.Context, id string) (listTimes, error) {
	var l listTimes
	t, ok := s.rec.latestTable()
	if !ok {
		return l, errors.New("no slot table")
	}
	granted, _ := t.table.HeldBy(id)
	values := make([]string, 0, len(granted))
	for _, slot := range granted {
		values = append(values, strconv.Itoa(slot))
	}
	all, err := labels.NewRequirement(sharderv1alpha1.SlotLabel(ringName), selection.In, values)
	if err != nil {
		return l, err
	}
	list := func(selector string) (time.Duration, int, error) {
		t0 := time.Now()
		cms, err := s.creator.CoreV1().ConfigMaps(objectNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return 0, 0, err
		}
		return time.Since(t0), len(cms.Items), nil
	}
	for range 3 {
		d, n, err := list(all.String())
		if err != nil {
			return l, err
		}
		l.batch, l.batchItems = append(l.batch, d), n
	}
	sels, err := slots.GroupSelectors(sharderv1alpha1.SlotLabel(ringName), granted, s.count)
	if err != nil {
		return l, err
	}
	for _, sel := range sels {
		d, n, err := list(sel.String())
		if err != nil {
			return l, err
		}
		l.perGroup = append(l.perGroup, d)
		l.groupItems += n
	}
	slices.Sort(l.batch)
	slices.Sort(l.perGroup)
	l.load = loadAverage()
	return l, nil
}

// stopOne stops the instance the scale-out added, for good.
func (s *slotsRun) stopOne(ctx context.Context) error {
	live := s.live()
	id := s.added
	if id == "" {
		return errors.New("no instance was added")
	}
	w, hs, settled, cpu, err := s.change(ctx, "stop", func() error { return s.stopInstance(id) }, 3*time.Minute)
	if err != nil {
		return err
	}
	s.addChange(fmt.Sprintf("%s (the one added) stopped for good (Lease released, not restarting), %d → %d instances", id, len(live), len(live)-1), w, hs, settled, cpu, 0, loadAverage())
	return nil
}

// rollingRestart stops and starts again every instance, one at a time,
// with the same IDs, each once the ring settled after the previous one.
func (s *slotsRun) rollingRestart(ctx context.Context) error {
	live := s.live()
	var total slotWindow
	var all []handOver
	var cpuAll, took time.Duration
	for _, id := range live {
		w, hs, settled, cpu, err := s.change(ctx, "restart of "+id, func() error {
			if err := s.stopInstance(id); err != nil {
				return err
			}
			return s.startInstance(ctx, id, leaseholder.ReleaseRestart)
		}, 3*time.Minute)
		if err != nil {
			return err
		}
		total.objectWrites += w.objectWrites
		total.ringWrites += w.ringWrites
		total.leaseWrites += w.leaseWrites
		total.acks += w.acks
		all = append(all, hs...)
		cpuAll += cpu
		took += settled
		fmt.Printf("  %s restarted: %d ring + %d Lease writes (%d acknowledgements), %d slots moved, settled after %s\n", id, w.ringWrites, w.leaseWrites, w.acks, len(hs), seconds(settled))
	}
	s.add(fmt.Sprintf("rolling restart of the %d instances (same IDs, one at a time): object writes", len(live)), fmt.Sprintf("**%d**", total.objectWrites), "", "0", total.objectWrites == 0)
	writes := total.ringWrites + total.leaseWrites - total.acks
	per := float64(writes) / float64(len(live))
	s.add("  ring status + Lease writes other than renewals and acknowledgements (ring + Lease), all restarts; acknowledgements besides; per restart",
		fmt.Sprintf("%d (%d + %d); %d; **%.1f**", writes, total.ringWrites, total.leaseWrites-total.acks, total.acks, per), "", fmt.Sprintf("≤ %d per change", targetSlotWrites), per <= targetSlotWrites)
	s.add("  slots moved, all restarts; time to settle, all restarts", fmt.Sprintf("%d; %s", len(all), seconds(took)), "", "", true)
	s.add("  sharder CPU, all restarts", fmt.Sprintf("%s; load %s", seconds(cpuAll), loadAverage()), "", "", true)
	return nil
}

// recordRSS reads the sharder's RSS and live heap a while after its last
// work, with the ring's objects as they are.
func (s *slotsRun) recordRSS(ctx context.Context) error {
	if err := sleep(ctx, 30*time.Second); err != nil {
		return err
	}
	m, err := s.sharder.Memory()
	if err != nil {
		return err
	}
	heap, err := s.liveHeap(ctx)
	if err != nil {
		return err
	}
	s.rss = append(s.rss, rssAt{objects: s.total, rss: m.RSS, anon: rssParts(s.sharder.Pid()), heap: heap, load: loadAverage()})
	return nil
}

// memory creates --large-objects objects in all through the webhook and
// reads the sharder's RSS again.
func (s *slotsRun) memory(ctx context.Context) error {
	if s.p.largeObjects > s.total {
		t0 := time.Now()
		if _, _, err := s.create(ctx, s.total, s.p.largeObjects, false); err != nil {
			return err
		}
		fmt.Printf("  %d objects in all after %s\n", s.total, time.Since(t0).Round(time.Second))
		if err := s.recordRSS(ctx); err != nil {
			return err
		}
	}
	for i, r := range s.rss {
		ok := r.rss <= targetSlotSharderMB<<20
		label := "  the same"
		if i == 0 {
			label = "sharder RSS (VmRSS, 30 s after its last work; its anonymous and file-backed parts) and live heap after GC"
		}
		s.add(fmt.Sprintf("%s with %d objects", label, r.objects), fmt.Sprintf("**%s** (%s), heap %s; load %s", mib(r.rss), r.anon, mib(uint64(r.heap)), r.load), "", fmt.Sprintf("≤ %d MiB", targetSlotSharderMB), ok)
	}
	w := s.rec.window(s.labelsAt, time.Now())
	s.add("object writes over the whole run once the labels existed (creations not counted)", fmt.Sprintf("**%d**", w.objectWrites), "", "0", w.objectWrites == 0)
	return nil
}

// rssParts returns the anonymous and file-backed parts of a process's RSS
// (RssAnon, RssFile of /proc/<pid>/status), or "" when unreadable.
func rssParts(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	return statusRSSParts(string(b))
}

// lateWriter writes to the writer set last, and discards what comes while
// none is set.
type lateWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lateWriter) set(w io.Writer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w = w
}

func (l *lateWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil {
		return len(b), nil
	}
	return l.w.Write(b)
}
