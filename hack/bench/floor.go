package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// floorLabel is the label the floor's patches write on the objects of the
// unrelated namespace.
const floorLabel = "bench.sharder.dev/floor"

// floor is one measurement of the API server's label-patch rate.
type floor struct {
	name    string
	patches int
	took    time.Duration
	// sharderCPU is the sharder process's CPU time during the measurement;
	// zero when no sharder process ran.
	sharderCPU time.Duration
	// machineCPU is the busy CPU time of the whole machine (every process)
	// during the measurement; zero when unknown.
	machineCPU time.Duration
}

// machinePerPatch returns the machine's busy CPU time per patch.
func (f floor) machinePerPatch() time.Duration {
	if f.patches == 0 {
		return 0
	}
	return f.machineCPU / time.Duration(f.patches)
}

// rate returns patches per second.
func (f floor) rate() float64 { return float64(f.patches) / f.took.Seconds() }

// timeFor returns how long n patches take at the floor's rate.
func (f floor) timeFor(n int) time.Duration {
	return time.Duration(float64(n) / f.rate() * float64(time.Second))
}

func (f floor) String() string { return fmt.Sprintf("%.0f patches/s", f.rate()) }

// floorPatcher sends the sharder's kind of write: a JSON merge patch of one
// label of a ConfigMap through the metadata client, from writers as many as
// the sharder's assignment workers. Each round writes a new value, so every
// patch changes the object (a patch that changes nothing is not written to
// etcd).
type floorPatcher struct {
	client    metadata.Interface
	namespace string
	workers   int
	objects   int
	round     atomic.Int64
}

func newFloorPatcher(cfg *rest.Config, namespace string, workers, objects int) (*floorPatcher, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &floorPatcher{client: mc, namespace: namespace, workers: workers, objects: objects}, nil
}

// measure sends n patches (n ≤ objects: each object is written once) to
// the ConfigMaps floor-00000 ... of its namespace and returns how long
// they took.
func (p *floorPatcher) measure(ctx context.Context, name string, n int) (floor, error) {
	n = min(n, p.objects)
	value := strconv.FormatInt(p.round.Add(1), 10)
	patch := []byte(`{"metadata":{"labels":{"` + floorLabel + `":"` + value + `"}}}`)
	res := p.client.Resource(configMaps).Namespace(p.namespace)
	cpu0 := machineCPU()
	start := time.Now()
	err := parallel(ctx, 0, n, p.workers, func(i int) error {
		_, err := res.Patch(ctx, objectName("floor", i), types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return floor{}, fmt.Errorf("measuring the floor: %w", err)
	}
	return floor{name: name, patches: n, took: time.Since(start), machineCPU: machineCPU() - cpu0}, nil
}

// measureLabels sends n patches that set (value non-empty) or remove the
// label key on the ConfigMaps prefix-00000 ... of namespace, object i
// getting value(i), and returns how long they took. With the ring's shard
// label on the ring's objects these are the sharder's own writes, seen by
// the same watches as the sharder's (the instances', the bench's): the
// floor of what the sharder does, rather than of writes that no watch
// selects.
func (p *floorPatcher) measureLabels(ctx context.Context, name, namespace, prefix, key string, n int, value func(int) string) (floor, error) {
	res := p.client.Resource(configMaps).Namespace(namespace)
	cpu0 := machineCPU()
	start := time.Now()
	err := parallel(ctx, 0, n, p.workers, func(i int) error {
		v := "null"
		if s := value(i); s != "" {
			v = strconv.Quote(s)
		}
		patch := []byte(`{"metadata":{"labels":{"` + key + `":` + v + `}}}`)
		_, err := res.Patch(ctx, objectName(prefix, i), types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return floor{}, fmt.Errorf("measuring the floor: %w", err)
	}
	return floor{name: name, patches: n, took: time.Since(start), machineCPU: machineCPU() - cpu0}, nil
}

// ringObjectPrefix names the ring's pre-existing objects.
const ringObjectPrefix = "pre"
