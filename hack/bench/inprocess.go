package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	corev1 "k8s.io/api/core/v1"

	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/sharder-dev/sharder/cmd/sharder/app"
	"github.com/sharder-dev/sharder/internal/localrun"
)

// inProcess stops the sharder process, adds the unrelated namespace (with
// as many unassigned objects as the first step) to the ring and runs the
// sharder inside this process, with the same command line, until they are
// assigned: the same figure as the first step without a process boundary
// of the sharder's own.
func (b *bench) inProcess(ctx context.Context) error {
	if err := b.sharder.Stop(30 * time.Second); err != nil {
		return err
	}
	stopped, err := b.measureFloor(ctx, "no sharder running (3 instances), again before the in-process variant")
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{}
	ns.Name = unrelatedNamespace
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, benchLabel)
	if err := b.c.Patch(ctx, ns, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return err
	}
	s, cmd, err := b.cl.PrepareSharder(ctx, localrun.SharderOptions{Name: "sharder-in-process", Args: b.p.sharderArgs})
	if err != nil {
		return err
	}
	for _, kv := range cmd.Env {
		k, v, _ := strings.Cut(kv, "=")
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	logFile, err := os.Create(filepath.Join(b.cl.LogDir, "sharder-in-process.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	waitCtx, cancelWait := context.WithCancel(ctx)
	defer cancelWait()
	writes0, err := processPatches()
	if err != nil {
		return err
	}
	cpu0 := selfCPU()
	t0 := time.Now()
	c := app.NewRunCommand()
	c.SetArgs(cmd.Args[1:])
	c.SetOut(logFile)
	c.SetErr(logFile)
	done := make(chan error, 1)
	go func() {
		done <- c.ExecuteContext(runCtx)
		cancelWait()
	}()
	b.cl.Webhook.AddBackend(net.JoinHostPort("127.0.0.1", strconv.Itoa(s.WebhookPort)))
	if err := b.waitOn(waitCtx, b.unrelated, 5*time.Minute, localrun.SettledOn(configMapKind, b.p.objects, b.liveInstances()...)); err != nil {
		select {
		case runErr := <-done:
			return fmt.Errorf("the in-process sharder stopped: %w (see %s)", runErr, logFile.Name())
		default:
			return err
		}
	}
	took := lastChange(b.unrelated.Snapshot()).Sub(t0)
	cpu := selfCPU() - cpu0
	writes1, err := processPatches()
	if err != nil {
		return err
	}
	writes := writes1 - writes0
	stop()
	if err := <-done; err != nil {
		return fmt.Errorf("the in-process sharder: %w", err)
	}
	b.addRatioTo(fmt.Sprintf("in-process variant: assign %d pre-existing objects (from the sharder's start, 3 instances)", b.p.objects),
		took, b.p.objects, 1.15, "", stopped)
	b.add("in-process variant: CPU per label write (this whole process: the sharder, the bench's watches, and their garbage collection at the sharder's GOGC=50)",
		fmt.Sprintf("%.0f µs (%s over %.0f writes)", float64(cpu.Microseconds())/writes, seconds(cpu), writes), "", "", true)
	return nil
}

// processPatches returns the PATCH requests client-go sent from this
// process so far (the floor's included: none is sent while the in-process
// sharder assigns).
func processPatches() (float64, error) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != "rest_client_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && l.GetValue() == "PATCH" {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum, nil
}

// selfCPU returns the user plus system CPU time of this process.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
