package reconcilelog

import (
	"strings"
	"testing"
	"time"

	"github.com/onsi/gomega"
)

func at(ms int) time.Time { return time.Date(2026, 1, 1, 0, 0, 0, ms*int(time.Millisecond), time.UTC) }

func rec(instance, object, phase string, ms int) Entry {
	return Entry{Instance: instance, Object: object, Phase: phase, Time: at(ms)}
}

func TestOverlaps(t *testing.T) {
	tests := []struct {
		name    string
		records []Entry
		exits   map[string][]time.Time
		want    int
	}{
		{
			name: "handover after end",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0), rec("a", "ns/x", PhaseEnd, 10),
				rec("b", "ns/x", PhaseStart, 11), rec("b", "ns/x", PhaseEnd, 20),
			},
		},
		{
			name: "second instance starts before the first ends",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0), rec("b", "ns/x", PhaseStart, 5),
				rec("a", "ns/x", PhaseEnd, 10), rec("b", "ns/x", PhaseEnd, 20),
			},
			want: 1,
		},
		{
			name: "same instance twice is no overlap",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0), rec("a", "ns/x", PhaseEnd, 10),
				rec("a", "ns/x", PhaseStart, 10), rec("a", "ns/x", PhaseEnd, 20),
			},
		},
		{
			name: "different objects never overlap",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0), rec("b", "ns/y", PhaseStart, 1),
				rec("a", "ns/x", PhaseEnd, 10), rec("b", "ns/y", PhaseEnd, 10),
			},
		},
		{
			name: "killed mid-reconcile: open until its exit",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0),
				rec("b", "ns/x", PhaseStart, 50), rec("b", "ns/x", PhaseEnd, 60),
			},
			exits: map[string][]time.Time{"a": {at(40)}},
		},
		{
			name: "killed after the other started",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0),
				rec("b", "ns/x", PhaseStart, 50), rec("b", "ns/x", PhaseEnd, 60),
			},
			exits: map[string][]time.Time{"a": {at(55)}},
			want:  1,
		},
		{
			name: "killed mid-reconcile and restarted: open until the run's exit",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0),
				rec("b", "ns/x", PhaseStart, 50), rec("b", "ns/x", PhaseEnd, 60),
				rec("a", "ns/x", PhaseStart, 70), rec("a", "ns/x", PhaseEnd, 80),
			},
			exits: map[string][]time.Time{"a": {at(40)}},
		},
		{
			name: "restarted, then killed mid-reconcile again after the other started",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0),
				rec("a", "ns/x", PhaseStart, 30),
				rec("b", "ns/x", PhaseStart, 50), rec("b", "ns/x", PhaseEnd, 60),
			},
			exits: map[string][]time.Time{"a": {at(20), at(55)}},
			want:  1,
		},
		{
			name: "a lost end within one run keeps the earlier start",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0),
				rec("b", "ns/x", PhaseStart, 50), rec("b", "ns/x", PhaseEnd, 60),
				rec("a", "ns/x", PhaseStart, 70), rec("a", "ns/x", PhaseEnd, 80),
			},
			exits: map[string][]time.Time{"a": {at(90)}},
			want:  1,
		},
		{
			name: "still running open interval overlaps",
			records: []Entry{
				rec("a", "ns/x", PhaseStart, 0),
				rec("b", "ns/x", PhaseStart, 50), rec("b", "ns/x", PhaseEnd, 60),
			},
			want: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Overlaps(Intervals(tt.records, tt.exits, at(1000)))
			if len(got) != tt.want {
				t.Fatalf("got %d overlaps %v, want %d", len(got), got, tt.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	g := gomega.NewWithT(t)
	in := `{"instance":"a","namespace":"ns","name":"x","phase":"start","time":"2026-01-01T00:00:00.000001Z","generation":2}
{"instance":"a","namespace":"ns","name":"x","phase":"end","time":"2026-01-01T00:00:00.5Z","generation":2}
{"instance":"a","namespace":"ns","na`
	recs, err := parse(strings.NewReader(in))
	g.Expect(err).NotTo(gomega.HaveOccurred())
	g.Expect(recs).To(gomega.HaveLen(2))
	g.Expect(recs[0]).To(gomega.Equal(Entry{Instance: "a", Object: "ns/x", Phase: PhaseStart,
		Time: time.Date(2026, 1, 1, 0, 0, 0, 1000, time.UTC), Generation: 2}))

	_, err = parse(strings.NewReader("garbage\n" + in))
	g.Expect(err).To(gomega.HaveOccurred(), "a broken line that is not the last one is an error")

	ivs := Intervals(recs, nil, time.Time{})
	g.Expect(ivs).To(gomega.HaveLen(1))
	g.Expect(LastReconcile(ivs)["ns/x"].End).To(gomega.Equal(time.Date(2026, 1, 1, 0, 0, 0, 5e8, time.UTC)))
}

func TestIntervalsAcrossRuns(t *testing.T) {
	g := gomega.NewWithT(t)
	// a's first run is killed mid-reconcile at 40 and restarted; its second
	// run reconciles x again and is still reconciling y.
	recs := []Entry{
		rec("a", "ns/x", PhaseStart, 0),
		rec("a", "ns/x", PhaseStart, 70), rec("a", "ns/x", PhaseEnd, 80),
		rec("a", "ns/y", PhaseStart, 90),
	}
	ivs := Intervals(recs, map[string][]time.Time{"a": {at(40)}}, at(1000))
	g.Expect(ivs).To(gomega.Equal([]Interval{
		{Instance: "a", Object: "ns/x", Start: at(0), End: at(40), Open: true},
		{Instance: "a", Object: "ns/x", Start: at(70), End: at(80)},
		{Instance: "a", Object: "ns/y", Start: at(90), End: at(1000), Open: true},
	}))
}
