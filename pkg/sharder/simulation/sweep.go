package simulation

import (
	"errors"
	"fmt"
	"slices"
)

// Size is what Sweep measures for one number of instances.
type Size struct {
	// Instances is the number of instances.
	Instances int `json:"instances"`
	// Keys is the number of keys placed.
	Keys int `json:"keys"`
	// MaxOverMean and MinOverMean compare the instance holding the most
	// (least) keys with its fair share.
	MaxOverMean float64 `json:"maxOverMean"`
	MinOverMean float64 `json:"minOverMean"`
	// AddMovedOverIdeal is the keys adding one instance moves over the
	// fewest it must move.
	AddMovedOverIdeal float64 `json:"addMovedOverIdeal"`
	// RemoveMovedOverIdeal is the same for removing one instance; 0 for a
	// ring of one instance, which cannot lose one.
	RemoveMovedOverIdeal float64 `json:"removeMovedOverIdeal,omitempty"`
	// BuildSeconds is the wall time building the ring of Instances took.
	BuildSeconds float64 `json:"buildSeconds"`
}

// Sweep runs opts for every number of instances in sizes, adding one
// instance and removing one, instead of opts.Instances, opts.Add and
// opts.Remove. With keysPerInstance above 0, a ring of n instances places
// the first keysPerInstance*n keys of opts.Keys, so that every size is
// measured with as many keys per instance; opts.Keys must hold enough for
// the largest size. With keysPerInstance 0, every size places all keys.
func Sweep(opts Options, sizes []int, keysPerInstance int) ([]Size, error) {
	if len(sizes) == 0 {
		return nil, errors.New("no sizes to sweep")
	}
	if slices.Min(sizes) < 1 {
		return nil, fmt.Errorf("sizes must be at least 1, got %d", slices.Min(sizes))
	}
	if keysPerInstance < 0 {
		return nil, fmt.Errorf("keys per instance must not be negative, got %d", keysPerInstance)
	}
	if need := keysPerInstance * slices.Max(sizes); need > len(opts.Keys) {
		return nil, fmt.Errorf("%d instances of %d keys need %d keys, got %d", slices.Max(sizes), keysPerInstance, need, len(opts.Keys))
	}
	keys := opts.Keys
	out := make([]Size, 0, len(sizes))
	for _, n := range sizes {
		run := opts
		run.Instances, run.Add, run.Remove = n, 1, 0
		if keysPerInstance > 0 {
			run.Keys = keys[:keysPerInstance*n]
		}
		added, err := Run(run)
		if err != nil {
			return nil, err
		}
		size := Size{
			Instances:         n,
			Keys:              len(run.Keys),
			MaxOverMean:       added.MaxOverMean,
			MinOverMean:       added.MinOverMean,
			AddMovedOverIdeal: added.MovedOverIdeal,
			BuildSeconds:      added.BuildSeconds,
		}
		if n > 1 {
			run.Add, run.Remove = 0, 1
			removed, err := Run(run)
			if err != nil {
				return nil, err
			}
			size.RemoveMovedOverIdeal = removed.MovedOverIdeal
		}
		out = append(out, size)
	}
	return out, nil
}
