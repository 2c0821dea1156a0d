package reconcilelog

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func readRecords(t *testing.T, path string) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Record
	s := bufio.NewScanner(f)
	for s.Scan() {
		var r Record
		if err := json.Unmarshal(s.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", s.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestWrapRecordsStartAndEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reconcile.jsonl")
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(start)
	l, err := Open(path, "instance-a", clk)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	r := l.Wrap(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		clk.SetTime(start.Add(time.Second))
		SetGeneration(ctx, 7)
		if req.Name == "bad" {
			return reconcile.Result{}, boom
		}
		return reconcile.Result{}, nil
	}))
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "good"}}); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(start)
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "bad"}}); !errors.Is(err, boom) {
		t.Fatalf("error = %v; the wrapper must return next's error", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	got := readRecords(t, path)
	want := []Record{
		{Time: start, Instance: "instance-a", Namespace: "ns", Name: "good", Phase: PhaseStart},
		{Time: start.Add(time.Second), Instance: "instance-a", Namespace: "ns", Name: "good", Phase: PhaseEnd, Generation: 7},
		{Time: start, Instance: "instance-a", Namespace: "ns", Name: "bad", Phase: PhaseStart},
		{Time: start.Add(time.Second), Instance: "instance-a", Namespace: "ns", Name: "bad", Phase: PhaseEnd, Generation: 7, Error: "boom"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !got[i].Time.Equal(want[i].Time) {
			t.Errorf("record %d time = %v, want %v", i, got[i].Time, want[i].Time)
		}
		got[i].Time = want[i].Time
		if got[i] != want[i] {
			t.Errorf("record %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestConcurrentWritesStayWholeLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reconcile.jsonl")
	l, err := Open(path, "i", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := l.Wrap(reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	}))
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				_, _ = r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "o"}})
			}
		}()
	}
	wg.Wait()
	_ = l.Close()
	if got := len(readRecords(t, path)); got != 1600 {
		t.Fatalf("got %d records, want 1600", got)
	}
}
