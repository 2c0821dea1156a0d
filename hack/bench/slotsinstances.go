package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// The slots mode's in-process instances: started, stopped, and watched
// until the ring settles.

// startInstance starts an in-process instance of the ring in slot mode.
func (s *slotsRun) startInstance(ctx context.Context, id string, release leaseholder.Release) error {
	cfg := rest.CopyConfig(s.instUser.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	instOpts := instance.Options{
		Ring: ringName, Identity: id,
		Lease: leaseholder.Options{
			Namespace:     leaseNamespace,
			LeaseDuration: s.p.leaseDuration,
			RenewPeriod:   s.p.leaseDuration / 5,
			Release:       release,
		},
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		NewCache:               instance.NewCache(instOpts, &corev1.ConfigMap{}),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("instance %s: %w", id, err)
	}
	inst, err := instance.Setup(mgr, instOpts)
	if err != nil {
		return fmt.Errorf("instance %s: %w", id, err)
	}
	spec := s.spec()
	r, err := inst.Wrap(&corev1.ConfigMap{}, reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		slot := slots.ForMainObject(spec, "", "ConfigMap", req.Namespace, req.Name)
		s.rec.reconciled(id, slot, time.Now())
		return reconcile.Result{}, nil
	}))
	if err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("bench").For(&corev1.ConfigMap{}).
		WithOptions(controllerOptions()).Complete(r); err != nil {
		return err
	}
	ictx, cancel := context.WithCancel(ctx)
	si := &slotInstance{inst: inst, cancel: cancel, done: make(chan error, 1)}
	go func() { si.done <- mgr.Start(ictx) }()
	s.mu.Lock()
	s.instances[id] = si
	s.mu.Unlock()
	return nil
}

// spec is what the slot of an object depends on in the ring's spec.
func (s *slotsRun) spec() *sharderv1alpha1.ControllerRingSpec {
	return &sharderv1alpha1.ControllerRingSpec{Assignment: &sharderv1alpha1.RingAssignment{Unit: sharderv1alpha1.AssignmentUnitSlots,
		Slots: &sharderv1alpha1.RingSlots{Count: int32(s.count)}}} //nolint:gosec // bounded by the CRD
}

// stopInstance stops an instance gracefully (it releases its Lease) and
// waits for it to return.
func (s *slotsRun) stopInstance(id string) error {
	s.mu.Lock()
	si := s.instances[id]
	delete(s.instances, id)
	s.mu.Unlock()
	if si == nil {
		return fmt.Errorf("no instance %s", id)
	}
	si.cancel()
	select {
	case err := <-si.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("instance %s: %w", id, err)
		}
		return nil
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("instance %s did not stop", id)
	}
}

func (s *slotsRun) stopAll() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.instances))
	for id := range s.instances {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		_ = s.stopInstance(id)
	}
}

func (s *slotsRun) live() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.instances))
	for id := range s.instances {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// failure returns an error when the sharder or an instance exited.
func (s *slotsRun) failure() error {
	if s.sharder != nil && s.sharder.Exited() {
		return fmt.Errorf("the sharder exited (%w); its log says why", s.sharder.ExitError())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, si := range s.instances {
		select {
		case err := <-si.done:
			si.done <- err
			return fmt.Errorf("instance %s stopped: %w", id, err)
		default:
		}
	}
	return nil
}

// waitSettled waits until the latest table grants every slot to the live
// instances in equal shares, none releasing, and every live instance's
// record holds exactly its granted slots.
func (s *slotsRun) waitSettled(ctx context.Context, timeout time.Duration) error {
	return localrun.Poll(ctx, timeout, 50*time.Millisecond, func() error {
		if err := s.failure(); err != nil {
			return errors.Join(err, errStop)
		}
		t, ok := s.rec.latestTable()
		if !ok {
			return errors.New("no slot table yet")
		}
		live := s.live()
		if !balanced(t.table, live) {
			return fmt.Errorf("table of revision %d not balanced over %v", t.table.Revision, live)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, id := range live {
			rec, ok := s.instances[id].inst.SlotRecord()
			granted, _ := t.table.HeldBy(id)
			if !ok || !slices.Equal(rec.Slots, granted) {
				return fmt.Errorf("instance %s holds %d slots of the %d granted", id, len(rec.Slots), len(granted))
			}
		}
		return nil
	})
}
