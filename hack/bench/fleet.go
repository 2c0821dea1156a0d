package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
)

// fleet holds the Leases of many simulated instances from this process,
// one leaseholder.Holder each, all writing through one client. Its client
// cannot watch, so the holders do not watch their own Leases: a thousand
// watches would cost this process more than the renewals, and a Lease
// nobody deletes needs none.
type fleet struct {
	client        client.Client
	ring          string
	namespace     string
	leaseDuration time.Duration

	// log receives the holders' messages and a summary of their requests.
	log *fleetLog

	mu      sync.Mutex
	members map[string]*member
}

// member is one simulated instance of a fleet.
type member struct {
	holder *leaseholder.Holder
	cancel context.CancelFunc
	done   chan struct{}
	// killed stops the renewals without a release, as a process killed
	// with SIGKILL (or cut off from the API server) stops them.
	killed atomic.Bool
	// stopping is set once the member was asked to stop gracefully.
	stopping atomic.Bool
	// lost is set when the holder gave the Lease up on its own.
	lost atomic.Bool
	err  error
}

// fleetQPS bounds the requests of every holder together: with a thousand
// holders renewing every 5 s and acknowledging drains, far above what
// they need, so that no renewal waits for a token.
const fleetQPS = 2000

func newFleet(cfg *rest.Config, ring, namespace string, leaseDuration time.Duration, log *fleetLog) (*fleet, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = fleetQPS, 2*fleetQPS
	// Protobuf, as kubelets renew their node Leases: the API server decodes
	// and encodes 200 renewals a second for less than with JSON.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.Wrap(log.wrap)
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("creating the fleet's client: %w", err)
	}
	return &fleet{client: c, ring: ring, namespace: namespace, leaseDuration: leaseDuration, log: log, members: map[string]*member{}}, nil
}

// start starts holding the Lease of instance id until ctx ends. The holder
// renews every third of the lease duration (the library's default) and
// releases the Lease for good when stopped (stop).
func (f *fleet) start(ctx context.Context, id string) error {
	m := &member{done: make(chan struct{})}
	h, err := leaseholder.NewHolder(f.client, leaseholder.Options{
		Ring: f.ring, Namespace: f.namespace, Identity: id,
		LeaseDuration: f.leaseDuration,
		Release:       leaseholder.ReleaseStop,
		Check: func(context.Context) error {
			if m.killed.Load() {
				return errors.New("killed")
			}
			return nil
		},
		OnLost: func() { m.lost.Store(true) },
	})
	if err != nil {
		return err
	}
	m.holder = h
	ctx, m.cancel = context.WithCancel(logr.NewContext(ctx, f.log.logger().WithName(id)))
	f.mu.Lock()
	if _, ok := f.members[id]; ok {
		f.mu.Unlock()
		m.cancel()
		return fmt.Errorf("instance %s started twice", id)
	}
	f.members[id] = m
	f.mu.Unlock()
	go func() {
		defer close(m.done)
		m.err = h.Start(ctx)
	}()
	return nil
}

func (f *fleet) member(id string) (*member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.members[id]
	if !ok {
		return nil, fmt.Errorf("no instance %s in the fleet", id)
	}
	return m, nil
}

// held reports whether instance id holds its Lease.
func (f *fleet) held(id string) bool {
	m, err := f.member(id)
	return err == nil && m.holder.Held()
}

// heldCount returns how many members hold their Lease.
func (f *fleet) heldCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, m := range f.members {
		if m.holder.Held() {
			n++
		}
	}
	return n
}

// kill stops the renewals of instance id without releasing its Lease; its
// holder gives up at its renew deadline.
func (f *fleet) kill(id string) error {
	m, err := f.member(id)
	if err != nil {
		return err
	}
	m.killed.Store(true)
	return nil
}

// stop stops instance id gracefully: its holder releases the Lease. It
// returns once the release was written.
func (f *fleet) stop(ctx context.Context, id string) error {
	m, err := f.member(id)
	if err != nil {
		return err
	}
	m.stopping.Store(true)
	m.cancel()
	select {
	case <-m.done:
		return m.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// acknowledges reports whether instance id is running: it holds its Lease
// and was neither killed nor stopped, so it answers drains.
func (f *fleet) acknowledges(id string) bool {
	m, err := f.member(id)
	return err == nil && !m.killed.Load() && !m.stopping.Load() && m.holder.Held()
}

// live returns the members neither killed nor stopped, sorted.
func (f *fleet) live() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]string, 0, len(f.members))
	for id, m := range f.members {
		if !m.killed.Load() && !m.stopping.Load() {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// failure returns an error when a member neither killed nor stopped lost
// its Lease: on an overloaded control plane a renewal can wait past the
// renew deadline, and the figures would not be the ones meant.
func (f *fleet) failure() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var lost []string
	for id, m := range f.members {
		if m.lost.Load() && !m.killed.Load() {
			lost = append(lost, id)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	sort.Strings(lost)
	return fmt.Errorf("%d instances lost their Lease without being killed (first: %s): fleet.log in the run's logs says why, and what the holders' requests got back meanwhile; run again", len(lost), lost[0])
}

// killAll stops every renewal at the end of the run, without the releases
// that would set the sharder moving every object while the control plane
// stops.
func (f *fleet) killAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.members {
		m.killed.Store(true)
	}
}
