package localrun

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ProcessOptions configures StartProcess.
type ProcessOptions struct {
	// Name names the process in logs and its log file. Required.
	Name string
	// Path is the binary. Required.
	Path string
	// Args are the arguments. Default: none.
	Args []string
	// Env is added to the current environment. Default: none.
	Env []string
	// LogDir receives <Name>.log with the process's stdout and stderr.
	// Required.
	LogDir string
	// Restart restarts the process whenever it exits on its own, whatever
	// its exit status, as the kubelet restarts a container of
	// restartPolicy Always. Default: nil, never restarted.
	Restart *RestartPolicy
}

// RestartPolicy says how soon a process that exited is started again: after
// a backoff that starts at InitialBackoff and doubles with each restart up
// to MaxBackoff, back to InitialBackoff once a run lasted ResetAfter. Zero
// fields take their defaults.
type RestartPolicy struct {
	// InitialBackoff is the wait before the first restart. Default: 200ms.
	InitialBackoff time.Duration
	// MaxBackoff bounds the wait. Default: 5s.
	MaxBackoff time.Duration
	// ResetAfter is how long a run must last for the next restart to wait
	// InitialBackoff again. Default: 10s.
	ResetAfter time.Duration
}

func (r RestartPolicy) withDefaults() RestartPolicy {
	if r.InitialBackoff <= 0 {
		r.InitialBackoff = 200 * time.Millisecond
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = 5 * time.Second
	}
	r.MaxBackoff = max(r.MaxBackoff, r.InitialBackoff)
	if r.ResetAfter <= 0 {
		r.ResetAfter = 10 * time.Second
	}
	return r
}

// Process is a started program whose output goes to a log file. With a
// RestartPolicy it may run several times, as a container does: each run
// appends to the same log file, after a line saying why it was restarted.
//
// Stop and Kill end a process for good: the run in progress is stopped and
// no other run follows. Signal only delivers a signal: a run it ends is
// restarted like any run that exits on its own, so Signal(syscall.SIGKILL)
// is a crash the process recovers from, Kill one it does not.
type Process struct {
	// Name names the process.
	Name string
	// LogPath is the file with its stdout and stderr.
	LogPath string

	opts   ProcessOptions
	policy RestartPolicy
	log    *os.File
	// stop is closed by Stop and Kill: a pending restart is cancelled.
	stop chan struct{}
	// done is closed once the last run exited and no other follows.
	done chan struct{}

	mu       sync.Mutex
	cur      *run // the current run, or the last one
	final    bool // stopped for good
	restarts int
	exits    []Exit
}

// run is one run of a process.
type run struct {
	cmd     *exec.Cmd
	started time.Time
	// done is closed once the run exited.
	done chan struct{}
}

// Exit is how one run of a process ended.
type Exit struct {
	// Pid was the run's process ID (0 if the run could not start).
	Pid int
	// Time is when the run exited.
	Time time.Time
	// Err is its exit error: nil for a clean exit, an *exec.ExitError for
	// an exit status or a signal, or why it could not start.
	Err error
}

// StartProcess starts a program in a process group of its own. It is
// killed if the calling process dies (Linux parent-death signal), so a
// crashed run leaves nothing behind; so is each restarted run. An error
// means the first run could not start.
func StartProcess(opts ProcessOptions) (*Process, error) {
	if opts.Name == "" || opts.Path == "" || opts.LogDir == "" {
		return nil, errors.New("process: Name, Path and LogDir are required")
	}
	if err := os.MkdirAll(opts.LogDir, 0o750); err != nil {
		return nil, err
	}
	logPath := filepath.Join(opts.LogDir, opts.Name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", opts.Name, err)
	}
	p := &Process{Name: opts.Name, LogPath: logPath, opts: opts, log: f,
		stop: make(chan struct{}), done: make(chan struct{})}
	if opts.Restart != nil {
		p.policy = opts.Restart.withDefaults()
	}
	r, err := p.start()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	p.cur = r
	go p.supervise(r)
	return p, nil
}

// start starts one run. The caller holds p.mu or owns p alone.
func (p *Process) start() (*run, error) {
	fmt.Fprintf(p.log, "=== %s: %s %s\n", stamp(time.Now()), p.opts.Path, strings.Join(p.opts.Args, " "))
	// Not tied to a context: the caller stops the process with Stop or Kill.
	cmd := exec.CommandContext(context.Background(), p.opts.Path, p.opts.Args...) //nolint:gosec // runs the binaries the caller built
	cmd.Env = append(os.Environ(), p.opts.Env...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	// A process group of its own keeps a terminal's Ctrl-C away from it:
	// the caller decides how and when its processes stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", p.Name, err)
	}
	return &run{cmd: cmd, started: time.Now(), done: make(chan struct{})}, nil
}

// supervise waits for each run to exit and starts the next one, if any,
// after its backoff. r is the first run.
func (p *Process) supervise(r *run) {
	defer close(p.done)
	defer p.log.Close()
	var backoff time.Duration
	var startErr error
	for {
		var exit Exit
		var ranFor time.Duration
		if r != nil {
			exit.Err = r.cmd.Wait()
			exit.Pid, exit.Time = r.cmd.Process.Pid, time.Now()
			ranFor = exit.Time.Sub(r.started)
		} else {
			exit.Err, exit.Time = startErr, time.Now()
		}
		p.mu.Lock()
		p.exits = append(p.exits, exit)
		if r != nil {
			fmt.Fprintf(p.log, "=== %s: exited: %v\n", stamp(exit.Time), r.cmd.ProcessState)
			close(r.done)
		} else {
			fmt.Fprintf(p.log, "=== %s: %v\n", stamp(exit.Time), startErr)
		}
		if p.final || p.opts.Restart == nil {
			p.mu.Unlock()
			return
		}
		switch {
		case backoff == 0 || ranFor >= p.policy.ResetAfter:
			backoff = p.policy.InitialBackoff
		default:
			backoff = min(2*backoff, p.policy.MaxBackoff)
		}
		fmt.Fprintf(p.log, "=== %s: restarting after %s, attempt %d, backoff %s\n", stamp(time.Now()), describeExit(r), p.restarts+1, backoff)
		p.mu.Unlock()

		timer := time.NewTimer(backoff)
		select {
		case <-p.stop:
			timer.Stop()
		case <-timer.C:
		}
		p.mu.Lock()
		if p.final {
			fmt.Fprintf(p.log, "=== %s: stopped, not restarted\n", stamp(time.Now()))
			p.mu.Unlock()
			return
		}
		p.restarts++
		r, startErr = p.start()
		if r != nil {
			p.cur = r
		}
		p.mu.Unlock()
	}
}

// describeExit says how a run ended for the restart line.
func describeExit(r *run) string {
	if r == nil {
		return "failing to start"
	}
	return r.cmd.ProcessState.String()
}

func stamp(t time.Time) string { return t.Format(time.RFC3339Nano) }

// running returns the run in progress, nil if none (the process waits to
// be restarted, or exited for good). The caller holds p.mu.
func (p *Process) running() *run {
	if p.cur == nil {
		return nil
	}
	select {
	case <-p.cur.done:
		return nil
	default:
		return p.cur
	}
}

// Pid returns the process ID of the run in progress, or of the last run
// if none is: a restarted process has a new one.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur.cmd.Process.Pid
}

// Done is closed when the process has exited for good: it exited without a
// RestartPolicy, or was stopped with Stop or Kill.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited for good (Done is closed).
// A process waiting to be restarted has not.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Running reports whether a run is in progress: false while the process
// waits to be restarted and once it exited for good.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running() != nil
}

// Restarts returns how many times the process was started again after an
// exit.
func (p *Process) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// Exits returns how each run that ended so far ended, in order.
func (p *Process) Exits() []Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Exit(nil), p.exits...)
}

// ExitTime returns when the process's last run exited once it exited for
// good, false until then.
func (p *Process) ExitTime() (time.Time, bool) {
	if !p.Exited() {
		return time.Time{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exits[len(p.exits)-1].Time, true
}

// ExitError waits until the process exited for good and returns its last
// run's exit error (nil for a clean exit).
func (p *Process) ExitError() error {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exits[len(p.exits)-1].Err
}

// end marks the process as stopped for good, cancels a pending restart and
// returns the run in progress, nil if none.
func (p *Process) end() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.final {
		p.final = true
		close(p.stop)
	}
	return p.running()
}

// Stop ends the process for good: it sends SIGTERM to the run in progress
// and waits up to timeout for a graceful exit, then sends SIGKILL. It
// returns an error if the run had to be killed or exited with an error; a
// process that was not running (waiting to be restarted, or exited) just
// stays so.
func (p *Process) Stop(timeout time.Duration) error {
	r := p.end()
	if r == nil {
		<-p.done
		return nil
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
		<-p.done
		if err := p.ExitError(); err != nil {
			return fmt.Errorf("%s exited after SIGTERM: %w", p.Name, err)
		}
		return nil
	case <-time.After(timeout):
		_ = p.Kill()
		return fmt.Errorf("%s did not exit within %s of SIGTERM and was killed", p.Name, timeout)
	}
}

// Signal sends sig to the run in progress (e.g. SIGSTOP to freeze it,
// SIGCONT to resume it). It does not stop the process for good: with a
// RestartPolicy, a run the signal ends is restarted. It fails when no run
// is in progress.
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	r := p.running()
	p.mu.Unlock()
	if r == nil {
		return fmt.Errorf("signalling %s: not running", p.Name)
	}
	if err := r.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signalling %s: %w", p.Name, err)
	}
	return nil
}

// Kill ends the process for good: it sends SIGKILL to the run in progress,
// cancels any restart and waits for the process to be gone.
func (p *Process) Kill() error {
	r := p.end()
	if r != nil {
		if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("killing %s: %w", p.Name, err)
		}
	}
	<-p.done
	return nil
}

// Logs returns the content of the process's log file.
func (p *Process) Logs() string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.LogPath, err)
	}
	return string(data)
}

// CurrentLogs returns the log of the latest run: from the line that
// announced its start.
func (p *Process) CurrentLogs() string {
	logs := p.Logs()
	lines := strings.SplitAfter(logs, "\n")
	offset := len(logs)
	for i := len(lines) - 1; i >= 0; i-- {
		offset -= len(lines[i])
		if strings.HasPrefix(lines[i], "=== ") && strings.Contains(lines[i], ": "+p.opts.Path) {
			return logs[offset:]
		}
	}
	return logs
}

// Memory is a process's resident memory from /proc/<pid>/status.
type Memory struct {
	// RSS is the current resident set size (VmRSS) in bytes.
	RSS uint64
	// Peak is the peak resident set size (VmHWM) in bytes.
	Peak uint64
}

// Memory reads the resident memory of the run in progress (Linux only).
// It fails when no run is in progress.
func (p *Process) Memory() (Memory, error) {
	p.mu.Lock()
	r := p.running()
	p.mu.Unlock()
	if r == nil {
		return Memory{}, fmt.Errorf("reading memory of %s: not running", p.Name)
	}
	return ReadMemory(r.cmd.Process.Pid)
}

// ReadMemory reads VmRSS and VmHWM of pid from /proc.
func ReadMemory(pid int) (Memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, err
	}
	defer f.Close()
	return parseStatus(f)
}

func parseStatus(r io.Reader) (Memory, error) {
	var m Memory
	var seen int
	s := bufio.NewScanner(r)
	for s.Scan() {
		key, value, ok := strings.Cut(s.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		fields := strings.Fields(value)
		if len(fields) != 2 || fields[1] != "kB" {
			return m, fmt.Errorf("unexpected %s line %q", key, s.Text())
		}
		kb, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("parsing %s: %w", key, err)
		}
		if key == "VmRSS" {
			m.RSS = kb * 1024
		} else {
			m.Peak = kb * 1024
		}
		seen++
	}
	if err := s.Err(); err != nil {
		return m, err
	}
	if seen != 2 {
		return m, errors.New("VmRSS or VmHWM missing from /proc status")
	}
	return m, nil
}

// Processes tracks the processes of a run so they can be stopped and their
// logs printed together.
type Processes struct {
	mu    sync.Mutex
	procs []*Process
}

// Add tracks p.
func (ps *Processes) Add(p *Process) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.procs = append(ps.procs, p)
}

// All returns the tracked processes in start order.
func (ps *Processes) All() []*Process {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return append([]*Process(nil), ps.procs...)
}

// KillAll kills every tracked process for good.
func (ps *Processes) KillAll() {
	for _, p := range ps.All() {
		_ = p.Kill()
	}
}

// DumpLogs writes every tracked process's log to w.
func (ps *Processes) DumpLogs(w io.Writer) {
	for _, p := range ps.All() {
		fmt.Fprintf(w, "\n----- log of %s (%s) -----\n%s", p.Name, p.LogPath, p.Logs())
	}
}
