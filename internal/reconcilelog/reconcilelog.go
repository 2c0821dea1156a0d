package reconcilelog

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Phases of a record.
const (
	PhaseStart = "start"
	PhaseEnd   = "end"
)

// Record is one line of the log.
type Record struct {
	Time       time.Time `json:"time"`
	Instance   string    `json:"instance"`
	Namespace  string    `json:"namespace"`
	Name       string    `json:"name"`
	Phase      string    `json:"phase"`
	Generation int64     `json:"generation"`
	Error      string    `json:"error,omitempty"`
}

// Log writes records to a file. It is safe for concurrent use.
type Log struct {
	instance string
	clock    clock.PassiveClock

	mu   sync.Mutex
	file *os.File
}

// Open opens (creating or appending to) the log file at path for the
// instance's records. clk stamps the records; nil means the real clock.
func Open(path, instance string, clk clock.PassiveClock) (*Log, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening reconcile log: %w", err)
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Log{instance: instance, clock: clk, file: f}, nil
}

// Close closes the file; records written afterwards are dropped.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file == nil {
		return nil
	}
	err := l.file.Close()
	l.file = nil
	return err
}

// write appends rec as one line. A failed write is dropped: the log
// observes the operator and must never stop it.
func (l *Log) write(rec Record) {
	line, err := json.Marshal(rec)
	if err != nil {
		return
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		_, _ = l.file.Write(line)
	}
}

// Wrap returns a reconciler that records the start and end of every call
// of next. The start is written before next is called and the end after it
// returned, so the interval between them covers the whole reconcile.
func (l *Log) Wrap(next reconcile.Reconciler) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		gen := &atomic.Int64{}
		l.write(Record{Time: l.clock.Now().UTC(), Instance: l.instance, Namespace: req.Namespace, Name: req.Name, Phase: PhaseStart})
		res, err := next.Reconcile(context.WithValue(ctx, generationKey{}, gen), req)
		end := Record{Time: l.clock.Now().UTC(), Instance: l.instance, Namespace: req.Namespace, Name: req.Name,
			Phase: PhaseEnd, Generation: gen.Load()}
		if err != nil {
			end.Error = err.Error()
		}
		l.write(end)
		return res, err
	})
}

type generationKey struct{}

// SetGeneration reports the generation of the object the reconcile in ctx
// works on; it is written into the "end" record. It does nothing when ctx
// does not come from Wrap.
func SetGeneration(ctx context.Context, generation int64) {
	if gen, ok := ctx.Value(generationKey{}).(*atomic.Int64); ok {
		gen.Store(generation)
	}
}
