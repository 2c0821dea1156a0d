package localrun

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onsi/gomega"
)

func TestParseStatus(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Memory
		wantErr bool
	}{
		{
			name: "both present",
			in:   "Name:\tsharder\nVmPeak:\t  99999 kB\nVmHWM:\t   65536 kB\nVmRSS:\t   32768 kB\nThreads:\t9\n",
			want: Memory{RSS: 32768 * 1024, Peak: 65536 * 1024},
		},
		{name: "missing RSS", in: "VmHWM:\t 1 kB\n", wantErr: true},
		{name: "bad unit", in: "VmHWM:\t 1 MB\nVmRSS:\t 1 kB\n", wantErr: true},
		{name: "bad number", in: "VmHWM:\t x kB\nVmRSS:\t 1 kB\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatus(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestProcessStopAndKill(t *testing.T) {
	dir := t.TempDir()
	// A shell that ignores SIGTERM must be killed after the timeout; one
	// that honours it stops gracefully.
	graceful, err := StartProcess(ProcessOptions{Name: "graceful", Path: "/bin/sh", Args: []string{"-c", "echo pid-$$; exec sleep 60"}, LogDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	stubborn, err := StartProcess(ProcessOptions{Name: "stubborn", Path: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo pid-$$; while true; do sleep 0.1; done"}, LogDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	// The log starts with the command line; the shell's own output carries
	// its pid.
	waitForLog(t, graceful, `pid-\d+`)
	waitForLog(t, stubborn, `pid-\d+`)

	if m, err := graceful.Memory(); err != nil || m.RSS == 0 || m.Peak < m.RSS {
		t.Fatalf("memory of a running process: %+v, %v", m, err)
	}
	if err := graceful.Stop(5 * time.Second); err == nil {
		t.Fatal("sleep ends with SIGTERM's exit status; want an error saying so")
	}
	if !graceful.Exited() {
		t.Fatal("graceful process still running after Stop")
	}
	if err := stubborn.Stop(300 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Stop of a process ignoring SIGTERM: %v, want an error saying it was killed", err)
	}
	if ws, ok := stubborn.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("stubborn process ended with %v, want SIGKILL", stubborn.cmd.ProcessState)
	}
	if _, err := os.Stat(filepath.Join(dir, "stubborn.log")); err != nil {
		t.Fatal(err)
	}
}

func waitForLog(t *testing.T, p *Process, pattern string) {
	t.Helper()
	gomega.NewWithT(t).Eventually(p.Logs).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(gomega.MatchRegexp(pattern))
}
