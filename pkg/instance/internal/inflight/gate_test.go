package inflight

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func key(name string) Key {
	return Key{GroupKind: schema.GroupKind{Kind: "ConfigMap"}, NamespacedName: types.NamespacedName{Namespace: "n", Name: name}}
}

func TestAdmission(t *testing.T) {
	g := NewWithT(t)
	tr := New()
	g.Expect(tr.Begin(key("a"))).To(Equal(NotOpen))
	tr.Open()
	g.Expect(tr.Begin(key("a"))).To(Equal(Admitted))
	g.Expect(tr.Begin(key("a"))).To(Equal(Admitted), "two controllers may reconcile one object")
	g.Expect(tr.Running()).To(Equal(2))
	tr.Close()
	g.Expect(tr.Begin(key("b"))).To(Equal(Closed))
	tr.End(key("a"))
	tr.End(key("a"))
	g.Expect(tr.Running()).To(BeZero())
	tr.End(key("a")) // unmatched End is ignored
	g.Expect(tr.Running()).To(BeZero())
}

func TestDrainWaitsForOtherReconciles(t *testing.T) {
	g := NewWithT(t)
	tr := New()
	tr.Open()
	a := key("a")
	g.Expect(tr.Begin(a)).To(Equal(Admitted)) // another controller's reconcile
	g.Expect(tr.Begin(a)).To(Equal(Admitted)) // the one that found the drain label

	drained := make(chan bool)
	go func() {
		ok, err := tr.Drain(context.Background(), a)
		g.Expect(err).NotTo(HaveOccurred())
		drained <- ok
	}()
	// While the drain waits, new reconciles of a are turned away, others not.
	g.Eventually(func() Admission {
		adm := tr.Begin(a)
		if adm == Admitted {
			tr.End(a)
		}
		return adm
	}).Should(Equal(Draining))
	g.Expect(tr.Begin(key("b"))).To(Equal(Admitted))
	g.Consistently(drained, 50*time.Millisecond).ShouldNot(Receive())

	tr.End(a) // the other reconcile ends
	g.Eventually(drained).Should(Receive(BeTrue()))

	ok, err := tr.Drain(context.Background(), a)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse(), "a second drain of the same object is refused")

	tr.End(a) // acknowledgement done
	g.Expect(tr.Begin(a)).To(Equal(Admitted), "the object may be reconciled again once reassigned")
}

func TestDrainGivesUpWithContext(t *testing.T) {
	g := NewWithT(t)
	tr := New()
	tr.Open()
	a := key("a")
	g.Expect(tr.Begin(a)).To(Equal(Admitted))
	g.Expect(tr.Begin(a)).To(Equal(Admitted))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ok, err := tr.Drain(ctx, a)
	g.Expect(ok).To(BeFalse())
	g.Expect(err).To(MatchError(context.DeadlineExceeded))
	tr.End(a)
	g.Expect(tr.Begin(a)).To(Equal(Admitted), "a withdrawn drain does not block the object")
}

func TestDrainWithoutBegin(t *testing.T) {
	g := NewWithT(t)
	tr := New()
	tr.Open()
	ok, err := tr.Drain(context.Background(), key("a"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse())
}

func TestWait(t *testing.T) {
	g := NewWithT(t)
	tr := New()
	tr.Open()
	g.Expect(tr.Wait(context.Background())).To(Succeed())

	var wg sync.WaitGroup
	for _, name := range []string{"a", "b", "c"} {
		g.Expect(tr.Begin(key(name))).To(Equal(Admitted))
	}
	waited := make(chan error)
	go func() { waited <- tr.Wait(context.Background()) }()
	for _, name := range []string{"a", "b"} {
		wg.Go(func() { tr.End(key(name)) })
	}
	wg.Wait()
	g.Consistently(waited, 50*time.Millisecond).ShouldNot(Receive())
	tr.End(key("c"))
	g.Eventually(waited).Should(Receive(BeNil()))

	g.Expect(tr.Begin(key("d"))).To(Equal(Admitted))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g.Expect(tr.Wait(ctx)).To(MatchError(context.Canceled))
}

func TestConcurrentUse(t *testing.T) {
	tr := New()
	tr.Open()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			k := key(string(rune('a' + i%3)))
			for range 1000 {
				if tr.Begin(k) != Admitted {
					continue
				}
				if i%4 == 0 {
					_, _ = tr.Drain(context.Background(), k)
				}
				tr.End(k)
			}
		})
	}
	wg.Wait()
	if n := tr.Running(); n != 0 {
		t.Fatalf("running = %d after all reconciles ended", n)
	}
}

func TestCancel(t *testing.T) {
	g := NewWithT(t)
	tr := New()
	tr.Open()
	errMoved, errLost := errors.New("moved"), errors.New("lost")
	begin := func(k Key) (context.Context, func()) {
		ctx, cancel := context.WithCancelCause(context.Background())
		admission, end := tr.BeginCancellable(k, cancel)
		g.Expect(admission).To(Equal(Admitted))
		return ctx, end
	}
	a1, endA1 := begin(key("a"))
	a2, endA2 := begin(key("a"))
	b, endB := begin(key("b"))
	g.Expect(tr.RunningOf(key("a"))).To(Equal(2))

	g.Expect(tr.Cancel(key("a"), errMoved)).To(HaveLen(2))
	g.Expect(context.Cause(a1)).To(MatchError(errMoved))
	g.Expect(context.Cause(a2)).To(MatchError(errMoved))
	g.Expect(b.Err()).NotTo(HaveOccurred(), "other objects run on")
	endA1()
	endA2()
	g.Expect(tr.RunningOf(key("a"))).To(BeZero())
	g.Expect(tr.Cancel(key("a"), errMoved)).To(BeEmpty(), "ended reconciles are not cancelled again")

	a3, endA3 := begin(key("a"))
	tr.Close()
	tr.CancelAll(errLost)
	g.Expect(context.Cause(a3)).To(MatchError(errLost))
	g.Expect(context.Cause(b)).To(MatchError(errLost))
	endA3()
	endB()
	g.Expect(tr.Running()).To(BeZero())
	admission, end := tr.BeginCancellable(key("c"), func(error) {})
	g.Expect(admission).To(Equal(Closed))
	g.Expect(end).To(BeNil())
}
