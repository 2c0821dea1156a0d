package leaseholder

import (
	"context"
	"errors"
	"fmt"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// ErrNotHeld is returned by Annotate when the holder does not hold its
// Lease (not yet, no longer, or stopped).
var ErrNotHeld = errors.New("the instance Lease is not held")

// annotation is a request of Annotate, served by the renewal loop.
type annotation struct {
	key, value string
	// done receives the outcome of the renewal that carried it.
	done chan error
}

// Annotate sets the annotation key to value on the Lease by a renewal
// brought forward: the holder renews at once, with the annotation, locked on
// the Lease's resourceVersion like every renewal, and the next renewal is
// due a renew period after this one. Every later write of the Lease while
// held keeps the annotation (a release keeps it too). Annotate returns nil
// once that renewal landed, ErrNotHeld when the Lease is not held, an error
// wrapping ErrLeaseLost when the renewal found it lost, ctx's error when ctx
// ended first, or the renewal's error when it failed (the annotation is
// still set: the next renewals carry it, and calling Annotate again renews
// at once again).
//
// An instance of a ring of unit Slots acknowledges a table's releases with
// it: key sharder.dev/slots-acknowledged (docs/design.md §11).
func (h *Holder) Annotate(ctx context.Context, key, value string) error {
	if key == "" {
		return errors.New("lease holder: annotation key required")
	}
	req := &annotation{key: key, value: value, done: make(chan error, 1)}
	if !h.Held() {
		return ErrNotHeld
	}
	select {
	case h.annotations <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-h.stopped:
		return ErrNotHeld
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-h.stopped:
		// Start returned after taking the request: it may have answered
		// just before.
		select {
		case err := <-req.done:
			return err
		default:
			return ErrNotHeld
		}
	}
}

// holding returns what the holder writes on its Lease while holding it,
// with the annotations asked for so far. Only the renewal loop's goroutine
// calls it.
func (h *Holder) holding() membership.Holding {
	return h.opts.holding(h.extra)
}

// answer reports the outcome of the renewal that carried req.
func (req *annotation) answer(ok bool, err error) {
	if req == nil {
		return
	}
	switch {
	case ok:
		req.done <- nil
	case err == nil:
		req.done <- ErrNotHeld
	default:
		req.done <- fmt.Errorf("renewing the Lease with annotation %s: %w", req.key, err)
	}
}
