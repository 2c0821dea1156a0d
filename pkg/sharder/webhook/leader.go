package webhook

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// FieldManagerPrefix starts the field manager of the sharder's label
// writes; the leader-election identity of the replica that sends them
// follows it (LeaderFieldManager).
const FieldManagerPrefix = "sharder/"

// LeaderFieldManager is the field manager the replica whose leader-election
// identity is identity writes labels with. With Options.LeaderLease set,
// the webhook allows the sharder's label writes only when they carry the
// field manager of the replica that currently leads.
func LeaderFieldManager(identity string) string { return FieldManagerPrefix + identity }

// leaderView is the sharder's leader-election Lease as this replica
// observes it: its holder, and when this replica saw the holder's last
// renewal on its own clock. As client-go's leader election, it trusts a
// record for the Lease's duration from the moment it observed it, whatever
// times are written on it, so a replica that was frozen (SIGSTOP, a long
// garbage collection) knows no leader until its watch shows a current one.
type leaderView struct {
	key   types.NamespacedName
	clock clock.PassiveClock

	mu sync.Mutex
	// holder, renew and duration are the record last observed; observed is
	// when this replica first saw it.
	holder   string
	renew    time.Time
	duration time.Duration
	observed time.Time
}

// observe records the Lease as this replica sees it now.
func (v *leaderView) observe(lease *coordinationv1.Lease) {
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	var renew time.Time
	if lease.Spec.RenewTime != nil {
		renew = lease.Spec.RenewTime.Time
	}
	duration := time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0)) * time.Second
	v.mu.Lock()
	defer v.mu.Unlock()
	if holder == v.holder && renew.Equal(v.renew) && duration == v.duration && !v.observed.IsZero() {
		return // the same record: a resync, or a change of something else
	}
	v.holder, v.renew, v.duration, v.observed = holder, renew, duration, v.clock.Now()
}

// forget records that the Lease is gone: no replica leads.
func (v *leaderView) forget() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.holder, v.renew, v.duration, v.observed = "", time.Time{}, 0, time.Time{}
}

// leader returns the identity of the replica that leads as far as this
// replica knows: the Lease's holder, while the holder's last renewal was
// observed less than the Lease's duration ago. It returns "" and why not
// otherwise.
func (v *leaderView) leader() (string, string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.holder == "":
		return "", fmt.Sprintf("Lease %s has no holder", v.key)
	case v.clock.Since(v.observed) >= v.duration:
		return "", fmt.Sprintf("this webhook replica has not seen Lease %s renewed for %s, its duration", v.key, v.duration)
	}
	return v.holder, ""
}

// leaderWatch keeps a leaderView up to date from a watch of the one Lease,
// on every replica.
type leaderWatch struct {
	view     *leaderView
	informer toolscache.SharedIndexInformer
}

var _ manager.LeaderElectionRunnable = &leaderWatch{}

func newLeaderWatch(cfg *rest.Config, key types.NamespacedName, clk clock.PassiveClock) (*leaderWatch, error) {
	cs, err := coordinationclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating a Lease client: %w", err)
	}
	lw := toolscache.NewListWatchFromClient(cs.RESTClient(), "leases", key.Namespace, fields.OneTermEqualSelector("metadata.name", key.Name))
	inf := toolscache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, toolscache.Indexers{})
	w := &leaderWatch{view: &leaderView{key: key, clock: clk}, informer: inf}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.update(obj) },
		UpdateFunc: func(_, obj any) { w.update(obj) },
		DeleteFunc: func(any) { w.view.forget() },
	})
	if err != nil {
		return nil, fmt.Errorf("watching Lease %s: %w", key, err)
	}
	return w, nil
}

func (w *leaderWatch) update(obj any) {
	if lease, ok := obj.(*coordinationv1.Lease); ok {
		w.view.observe(lease)
	}
}

// Start watches the Lease until ctx is done.
func (w *leaderWatch) Start(ctx context.Context) error {
	w.informer.RunWithContext(ctx)
	return nil
}

// NeedLeaderElection reports false: every replica's webhook needs the view.
func (w *leaderWatch) NeedLeaderElection() bool { return false }

// synced reports whether the watch has listed the Lease (or its absence).
func (w *leaderWatch) synced() bool { return w.informer.HasSynced() }
