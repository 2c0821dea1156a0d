package instance

import (
	"context"
	"os"
	"time"

	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
)

// This file holds what bounds an instance's acting: the check on its
// watch's lag and the bound on stopping.

// checksWatchLag reports whether the instance keeps its promise on the lag
// of its watches (Options.Lease.MaxWatchLag).
func (i *Instance) checksWatchLag() bool {
	return i.opts.Lease.MaxWatchLag > 0 && i.holder.Watching()
}

// watchCurrent reports whether the instance's watch is proven no further
// behind than Options.Lease.MaxWatchLag (always true when it makes no promise).
func (i *Instance) watchCurrent() bool {
	return !i.checksWatchLag() || i.opts.Lease.Clock.Since(i.holder.WatchedAt()) <= i.opts.Lease.MaxWatchLag
}

// checkWatchLag cancels the reconciles in flight whenever the watch falls
// further behind than Options.Lease.MaxWatchLag, until ctx ends. New reconciles
// ask watchCurrent themselves; this catches those that started before. It
// looks every eighth of the lag (at most every 250ms), which the sharder's
// force grace covers.
func (i *Instance) checkWatchLag(ctx context.Context) {
	if !i.checksWatchLag() {
		return
	}
	every := min(max(i.opts.Lease.MaxWatchLag/8, 10*time.Millisecond), 250*time.Millisecond)
	behind := false
	for {
		switch current := i.watchCurrent(); {
		case !current && !behind:
			behind = true
			i.bound(ErrStaleWatch, i.reconciles.CancelAll(ErrStaleWatch))
			i.log.Info("The instance's watch fell behind: no reconciles until it catches up",
				"lastRenewalSeen", i.holder.WatchedAt(), "maxWatchLag", i.opts.Lease.MaxWatchLag)
		case current && behind:
			behind = false
			i.log.Info("The instance's watch caught up: reconciling again")
		}
		t := i.opts.Lease.Clock.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// bound holds the instance to its bound on stopping (Options.Lease.StopTimeout)
// for the reconciles it just cancelled, with cause, because it may no longer
// act: when any of them is still running StopTimeout later, it calls
// Options.OnStopOverdue, whose default ends the process.
func (i *Instance) bound(cause error, cancelled inflight.Cancelled) {
	if len(cancelled) == 0 {
		return
	}
	t := i.opts.Lease.Clock.NewTimer(i.opts.Lease.StopTimeout)
	go func() {
		defer t.Stop()
		if cancelled.Wait(t.C()) {
			return
		}
		running := cancelled.Running()
		if running == 0 {
			return
		}
		i.log.Error(cause, "Reconciles cancelled because the instance may no longer act did not return within its stop timeout: ending the process, as promised on the Lease",
			"running", running, "stopTimeout", i.opts.Lease.StopTimeout)
		if i.opts.OnStopOverdue != nil {
			i.opts.OnStopOverdue(running)
			return
		}
		os.Exit(1)
	}()
}

// sleep waits d on the instance's clock; false when ctx ended first.
func (i *Instance) sleep(ctx context.Context, d time.Duration) bool {
	t := i.opts.Lease.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
