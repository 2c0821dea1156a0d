package localrun

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	var exitErr *exec.ExitError
	if err := stubborn.ExitError(); !errors.As(err, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("stubborn process ended with %v, want SIGKILL", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "stubborn.log")); err != nil {
		t.Fatal(err)
	}
}

func waitForLog(t *testing.T, p *Process, pattern string) {
	t.Helper()
	gomega.NewWithT(t).Eventually(p.Logs).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(gomega.MatchRegexp(pattern))
}

// runLine matches the line each run of the test programs prints first.
var runLine = regexp.MustCompile(`(?m)^run-(\d+)$`)

// runPids returns the pids the runs printed into the log, in order.
func runPids(p *Process) []string {
	var pids []string
	for _, m := range runLine.FindAllStringSubmatch(p.Logs(), -1) {
		pids = append(pids, m[1])
	}
	return pids
}

func TestProcessRestartsWithBackoff(t *testing.T) {
	g := gomega.NewWithT(t)
	policy := &RestartPolicy{InitialBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, ResetAfter: time.Minute}
	p, err := StartProcess(ProcessOptions{Name: "crashing", Path: "/bin/sh", Args: []string{"-c", "echo run-$$; exit 3"}, LogDir: t.TempDir(), Restart: policy})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	t.Cleanup(func() { _ = p.Kill() })

	g.Eventually(p.Restarts).WithTimeout(10 * time.Second).WithPolling(10 * time.Millisecond).Should(gomega.BeNumerically(">=", 4))
	g.Expect(p.Exited()).To(gomega.BeFalse(), "a process that is restarted has not exited for good")

	// Each exit is followed by a restart after a backoff that doubles up to
	// the maximum: the log says so, and the exits are at least that far apart.
	backoffs := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond}
	logs := p.Logs()
	for i, b := range backoffs {
		g.Expect(logs).To(gomega.MatchRegexp(`(?m)^=== \S+: restarting after exit status 3, attempt %d, backoff %s$`, i+1, b))
	}
	exits := p.Exits()
	g.Expect(len(exits)).To(gomega.BeNumerically(">=", len(backoffs)))
	for i, b := range backoffs[:len(backoffs)-1] {
		g.Expect(exits[i+1].Time.Sub(exits[i].Time)).To(gomega.BeNumerically(">=", b), "exit %d to exit %d", i, i+1)
		g.Expect(exits[i].Err).To(gomega.MatchError(gomega.ContainSubstring("exit status 3")))
	}

	// The runs share one log file: each run that exited wrote its own pid
	// there, in order.
	pids := runPids(p)
	g.Expect(len(pids)).To(gomega.BeNumerically(">=", len(exits)))
	for i, exit := range exits {
		g.Expect(pids[i]).To(gomega.Equal(strconv.Itoa(exit.Pid)), "run %d", i)
	}
	g.Expect(pids[0]).NotTo(gomega.Equal(pids[1]))
	// CurrentLogs starts at the latest run's start line: it holds one pid,
	// the last one the whole log holds.
	current := p.CurrentLogs()
	g.Expect(current).To(gomega.HavePrefix("=== "))
	g.Expect(current).To(gomega.ContainSubstring(": /bin/sh -c"))
	currentPids := regexp.MustCompile(`(?m)^run-(\d+)$`).FindAllStringSubmatch(current, -1)
	allPids := regexp.MustCompile(`(?m)^run-(\d+)$`).FindAllStringSubmatch(p.Logs(), -1)
	g.Expect(len(currentPids)).To(gomega.BeNumerically("<=", 1), current)
	if len(currentPids) == 1 {
		g.Expect(currentPids[0][1]).To(gomega.Equal(allPids[len(allPids)-1][1]))
	}

	// Killed on purpose: it ends for good.
	g.Expect(p.Kill()).To(gomega.Succeed())
	g.Expect(p.Exited()).To(gomega.BeTrue())
	g.Expect(p.Done()).To(gomega.BeClosed())
	restarts := p.Restarts()
	g.Consistently(p.Restarts).WithTimeout(4 * policy.MaxBackoff).Should(gomega.Equal(restarts))
	at, ok := p.ExitTime()
	g.Expect(ok).To(gomega.BeTrue())
	g.Expect(at).To(gomega.Equal(p.Exits()[len(p.Exits())-1].Time))
}

func TestProcessRestartBackoffResets(t *testing.T) {
	g := gomega.NewWithT(t)
	// Each run lasts longer than ResetAfter, so every restart waits the
	// initial backoff only.
	policy := &RestartPolicy{InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, ResetAfter: 100 * time.Millisecond}
	p, err := StartProcess(ProcessOptions{Name: "slow-crashing", Path: "/bin/sh", Args: []string{"-c", "echo run-$$; sleep 0.2; exit 0"}, LogDir: t.TempDir(), Restart: policy})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	t.Cleanup(func() { _ = p.Kill() })

	g.Eventually(p.Restarts).WithTimeout(10 * time.Second).WithPolling(10 * time.Millisecond).Should(gomega.BeNumerically(">=", 3))
	logs := p.Logs()
	for i := 1; i <= 3; i++ {
		// A clean exit is restarted too, as under restartPolicy Always.
		g.Expect(logs).To(gomega.MatchRegexp(`(?m)^=== \S+: restarting after exit status 0, attempt %d, backoff 50ms$`, i))
	}
	g.Expect(logs).NotTo(gomega.ContainSubstring("backoff 100ms"))
}

func TestProcessSignalledIsRestartedStoppedIsNot(t *testing.T) {
	g := gomega.NewWithT(t)
	policy := &RestartPolicy{InitialBackoff: 50 * time.Millisecond}
	p, err := StartProcess(ProcessOptions{Name: "server", Path: "/bin/sh", Args: []string{"-c", "echo run-$$; exec sleep 60"}, LogDir: t.TempDir(), Restart: policy})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	t.Cleanup(func() { _ = p.Kill() })
	g.Eventually(runPids).WithArguments(p).WithTimeout(10 * time.Second).Should(gomega.HaveLen(1))
	first := p.Pid()
	g.Expect(runPids(p)).To(gomega.Equal([]string{strconv.Itoa(first)}))

	// SIGKILL through Signal is a crash, not a stop: the process comes back
	// with a new pid, in a process group of its own.
	g.Expect(p.Signal(syscall.SIGKILL)).To(gomega.Succeed())
	g.Eventually(runPids).WithArguments(p).WithTimeout(10 * time.Second).Should(gomega.HaveLen(2))
	g.Expect(p.Restarts()).To(gomega.Equal(1))
	g.Expect(p.Running()).To(gomega.BeTrue())
	second := p.Pid()
	g.Expect(second).NotTo(gomega.Equal(first))
	g.Expect(runPids(p)[1]).To(gomega.Equal(strconv.Itoa(second)))
	pgid, err := syscall.Getpgid(second)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	g.Expect(pgid).To(gomega.Equal(second))
	g.Expect(p.Logs()).To(gomega.MatchRegexp(`(?m)^=== \S+: restarting after signal: killed, attempt 1, backoff 50ms$`))
	m, err := p.Memory()
	g.Expect(err).NotTo(gomega.HaveOccurred())
	g.Expect(m.RSS).To(gomega.BeNumerically(">", 0))

	// Stop ends it for good.
	g.Expect(p.Stop(5 * time.Second)).To(gomega.MatchError(gomega.ContainSubstring("exited after SIGTERM")))
	g.Expect(p.Exited()).To(gomega.BeTrue())
	g.Expect(p.Running()).To(gomega.BeFalse())
	g.Consistently(runPids).WithArguments(p).WithTimeout(500 * time.Millisecond).Should(gomega.HaveLen(2))
	g.Expect(p.Restarts()).To(gomega.Equal(1))
	g.Expect(p.Signal(syscall.SIGKILL)).To(gomega.MatchError(gomega.ContainSubstring("not running")))
	_, err = p.Memory()
	g.Expect(err).To(gomega.HaveOccurred())
}

func TestProcessStopDuringBackoff(t *testing.T) {
	g := gomega.NewWithT(t)
	// A long backoff: Stop must not wait for it.
	policy := &RestartPolicy{InitialBackoff: time.Minute}
	p, err := StartProcess(ProcessOptions{Name: "waiting", Path: "/bin/sh", Args: []string{"-c", "echo run-$$; exit 1"}, LogDir: t.TempDir(), Restart: policy})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	t.Cleanup(func() { _ = p.Kill() })
	g.Eventually(p.Logs).WithTimeout(10 * time.Second).Should(gomega.MatchRegexp(`(?m)^=== \S+: restarting after exit status 1, attempt 1, backoff 1m0s$`))
	g.Expect(p.Running()).To(gomega.BeFalse())
	g.Expect(p.Exited()).To(gomega.BeFalse(), "waiting to be restarted is not exited for good")

	start := time.Now()
	g.Expect(p.Stop(5*time.Second)).To(gomega.Succeed(), "nothing ran, so nothing failed to stop")
	g.Expect(time.Since(start)).To(gomega.BeNumerically("<", 5*time.Second))
	g.Expect(p.Exited()).To(gomega.BeTrue())
	g.Expect(p.Restarts()).To(gomega.Equal(0))
	g.Expect(p.ExitError()).To(gomega.MatchError(gomega.ContainSubstring("exit status 1")), "the last run's exit")
	g.Expect(p.Logs()).To(gomega.MatchRegexp(`(?m)^=== \S+: stopped, not restarted$`))
}

func TestProcessWithoutRestartPolicyIsNotRestarted(t *testing.T) {
	g := gomega.NewWithT(t)
	p, err := StartProcess(ProcessOptions{Name: "once", Path: "/bin/sh", Args: []string{"-c", "echo run-$$; exit 2"}, LogDir: t.TempDir()})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	g.Eventually(p.Done()).WithTimeout(10 * time.Second).Should(gomega.BeClosed())
	g.Expect(p.ExitError()).To(gomega.MatchError(gomega.ContainSubstring("exit status 2")))
	g.Expect(p.Restarts()).To(gomega.Equal(0))
	g.Expect(p.Exits()).To(gomega.HaveLen(1))
	g.Expect(runPids(p)).To(gomega.HaveLen(1))
	g.Expect(p.Logs()).NotTo(gomega.ContainSubstring("restarting"))
}
