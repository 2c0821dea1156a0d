package instance

import (
	"context"
	"errors"
	"slices"
	"time"

	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/slots"
)

// cacheSwitchTimeout bounds one switch of the cache to the record's slots
// (the new group caches' sync): a switch that cannot sync is tried again
// with the record as it is then, rather than hold up the switches that
// follow.
const cacheSwitchTimeout = time.Minute

// followCache makes the cache watch the record's slots whenever asked,
// until ctx ends. The record, not the cache, admits reconciles: the cache
// may be behind the record for as long as a switch takes.
//
// A released slot whose watch group keeps other slots lingers in the cache
// for Options.SlotCacheLinger (lingering), so that the list that narrows
// the group comes after the hand-over rather than during it; a group that
// gains a slot is listed anew anyway, and without its released slots.
//
// A slot the record let go of and gained again before the cache let go of
// it (a release withdrawn, or a slot granted back, while the cache was
// still switching, lingering, or not yet asked to drop it) stays in the
// cache: SetSlots tells the handlers nothing of its objects, whose requests
// the record refused meanwhile (changes, and the reconciles its release
// cancelled). Their objects are told to the handlers again (Retell) once
// the record holds the slot, so that the instance reconciles them.
func (s *slotUnit) followCache(ctx context.Context) {
	var narrow clock.Timer // set while slots linger
	defer func() {
		if narrow != nil {
			narrow.Stop()
		}
	}()
	for {
		narrowNow := false
		var narrowC <-chan time.Time
		if narrow != nil {
			narrowC = narrow.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-s.cacheWant:
		case <-narrowC:
			narrow, narrowNow = nil, true
		}
		s.mu.Lock()
		held := slices.Clone(s.record.Slots)
		gained := s.gained
		s.gained = map[int]bool{}
		s.mu.Unlock()
		// The slots gained that the cache serves already (only followCache
		// changes them) are told again, before the switch, which may take
		// long.
		serving := s.cache.Slots()
		var regained []int
		for _, slot := range serving {
			if _, holds := slices.BinarySearch(held, slot); holds && gained[slot] {
				regained = append(regained, slot)
			}
		}
		want := held
		if !narrowNow {
			want = s.lingering(held, serving)
			if len(want) > len(held) && narrow == nil {
				narrow = s.inst.opts.Lease.Clock.NewTimer(s.inst.opts.SlotCacheLinger)
			}
		}
		switchCtx, cancel := context.WithTimeout(ctx, cacheSwitchTimeout)
		var err error
		if len(regained) > 0 {
			if err = s.cache.Retell(switchCtx, regained); err != nil {
				s.mu.Lock()
				for _, slot := range regained {
					s.gained[slot] = true
				}
				s.mu.Unlock()
			} else {
				s.log.Info("Slots taken up again before the cache let go of them: their objects are requested again",
					"slots", slots.FormatList(regained))
			}
		}
		err = errors.Join(err, s.cache.SetSlots(switchCtx, want))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Info("Could not switch the cache to the record's slots; retrying", "error", err.Error())
			if !s.inst.sleep(ctx, s.inst.opts.RetryPeriod) {
				return
			}
			kick(s.cacheWant)
		}
	}
}

// lingering returns the slots the cache should watch for the record's held
// slots while released slots may linger: held, and each slot the cache
// serves and the record no longer holds whose watch group keeps a held
// slot and gains none (its group's cache then stays as it is). Sorted.
func (s *slotUnit) lingering(held, serving []int) []int {
	if s.inst.opts.SlotCacheLinger < 0 {
		return held
	}
	count := s.cache.Count()
	keeps, gains := map[int]bool{}, map[int]bool{}
	servingSet := make(map[int]bool, len(serving))
	for _, slot := range serving {
		servingSet[slot] = true
	}
	for _, slot := range held {
		keeps[slots.Group(slot, count)] = true
		if !servingSet[slot] {
			gains[slots.Group(slot, count)] = true
		}
	}
	want := slices.Clone(held)
	for _, slot := range serving {
		group := slots.Group(slot, count)
		if _, holds := slices.BinarySearch(held, slot); !holds && keeps[group] && !gains[group] {
			want = append(want, slot)
		}
	}
	slices.Sort(want)
	return want
}
