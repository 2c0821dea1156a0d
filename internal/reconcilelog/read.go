package reconcilelog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Entry is one line of a reconcile log as the overlap checker reads it: a
// Record with the object as namespace/name.
type Entry struct {
	// Instance is the instance ID of the writer.
	Instance string
	// Object is namespace/name of the reconciled object.
	Object string
	// Phase is PhaseStart or PhaseEnd.
	Phase string
	// Time is when the phase happened (same host clock for every instance).
	Time time.Time
	// Generation is the object's generation the reconcile saw (0 if unknown).
	Generation int64
	// Error is the error an end record reports ("" for success).
	Error string
}

// Read reads a reconcile log file; a missing file is an empty log (the
// instance never reconciled anything). A torn last line, as a
// killed process leaves behind, is ignored.
func Read(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parse(f)
}

func parse(r io.Reader) ([]Entry, error) {
	var out []Entry
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	var pendingErr error
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" {
			continue
		}
		if pendingErr != nil {
			return nil, pendingErr
		}
		rec, err := decode([]byte(line))
		if err != nil {
			// Only the last line may be torn.
			pendingErr = err
			continue
		}
		out = append(out, rec)
	}
	return out, s.Err()
}

// decode reads one line of a reconcile log.
func decode(line []byte) (Entry, error) {
	var raw Record
	if err := json.Unmarshal(line, &raw); err != nil {
		return Entry{}, fmt.Errorf("reconcile log line %q: %w", line, err)
	}
	if raw.Phase != PhaseStart && raw.Phase != PhaseEnd {
		return Entry{}, fmt.Errorf("reconcile log line %q: unknown phase %q", line, raw.Phase)
	}
	return Entry{Instance: raw.Instance, Object: raw.Namespace + "/" + raw.Name, Phase: raw.Phase,
		Time: raw.Time, Generation: raw.Generation, Error: raw.Error}, nil
}

// Interval is one reconcile of one object by one instance.
type Interval struct {
	Instance   string
	Object     string
	Start, End time.Time
	// Open is true when no end was logged (the instance was killed or is
	// still reconciling); End is then when its process's run exited, or now.
	Open       bool
	Generation int64
	// Error is the error the reconcile ended with ("" for success).
	Error string
}

// Intervals pairs start and end records per instance and object. An
// instance reconciles one object at most once at a time, so an end closes
// the latest start. exits gives, per instance, when each run of its process
// ended, in any order (a process restarted after it exited runs several
// times, writing to the same log): a start without an end lasts until the
// end of its run, the first exit at or after it, or until now if there is
// none. Two starts in a row within one run mean the first end was lost:
// the earlier start is kept, to be conservative.
func Intervals(records []Entry, exits map[string][]time.Time, now time.Time) []Interval {
	type key struct{ instance, object string }
	sortedExits := make(map[string][]time.Time, len(exits))
	for instance, ts := range exits {
		ts = append([]time.Time(nil), ts...)
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		sortedExits[instance] = ts
	}
	// runEnd is the first exit of instance at or after t.
	runEnd := func(instance string, t time.Time) (time.Time, bool) {
		ts := sortedExits[instance]
		i := sort.Search(len(ts), func(i int) bool { return !ts[i].Before(t) })
		if i == len(ts) {
			return time.Time{}, false
		}
		return ts[i], true
	}
	open := map[key]*Interval{}
	var out []Interval
	sorted := append([]Entry(nil), records...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Time.Before(sorted[j].Time) })
	for _, r := range sorted {
		k := key{r.Instance, r.Object}
		switch r.Phase {
		case PhaseStart:
			if prev := open[k]; prev != nil {
				end, ok := runEnd(prev.Instance, prev.Start)
				if !ok || end.After(r.Time) {
					// Same run: the first end was lost.
					continue
				}
				// The run that started prev ended before this start.
				prev.End, prev.Open = end, true
				out = append(out, *prev)
			}
			open[k] = &Interval{Instance: r.Instance, Object: r.Object, Start: r.Time, Generation: r.Generation}
		case PhaseEnd:
			iv := open[k]
			if iv == nil {
				continue
			}
			iv.End = r.Time
			if r.Generation != 0 {
				iv.Generation = r.Generation
			}
			iv.Error = r.Error
			out = append(out, *iv)
			delete(open, k)
		}
	}
	for _, iv := range open {
		iv.Open = true
		iv.End = now
		if end, ok := runEnd(iv.Instance, iv.Start); ok {
			iv.End = end
		}
		out = append(out, *iv)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Object != out[j].Object {
			return out[i].Object < out[j].Object
		}
		return out[i].Start.Before(out[j].Start)
	})
	return out
}

// Overlap is two instances reconciling one object at the same time.
type Overlap struct {
	A, B Interval
}

func (o Overlap) String() string {
	return fmt.Sprintf("%s: %s reconciled it %s..%s while %s reconciled it %s..%s", o.A.Object,
		o.A.Instance, o.A.Start.Format(time.StampMicro), o.A.End.Format(time.StampMicro),
		o.B.Instance, o.B.Start.Format(time.StampMicro), o.B.End.Format(time.StampMicro))
}

// Overlaps returns every pair of intervals of different instances on the
// same object that share a moment.
func Overlaps(intervals []Interval) []Overlap {
	byObject := map[string][]Interval{}
	for _, iv := range intervals {
		byObject[iv.Object] = append(byObject[iv.Object], iv)
	}
	var out []Overlap
	objects := make([]string, 0, len(byObject))
	for o := range byObject {
		objects = append(objects, o)
	}
	sort.Strings(objects)
	for _, o := range objects {
		ivs := byObject[o]
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].Start.Before(ivs[j].Start) })
		for i := range ivs {
			for j := i + 1; j < len(ivs) && !ivs[j].Start.After(ivs[i].End); j++ {
				if ivs[i].Instance != ivs[j].Instance {
					out = append(out, Overlap{A: ivs[i], B: ivs[j]})
				}
			}
		}
	}
	return out
}

// LastReconcile returns, per object, the latest finished reconcile.
func LastReconcile(intervals []Interval) map[string]Interval {
	out := map[string]Interval{}
	for _, iv := range intervals {
		if iv.Open {
			continue
		}
		if prev, ok := out[iv.Object]; !ok || iv.End.After(prev.End) {
			out[iv.Object] = iv
		}
	}
	return out
}
