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
}

// Process is a started program whose output goes to a log file.
type Process struct {
	// Name names the process.
	Name string
	// LogPath is the file with its stdout and stderr.
	LogPath string

	cmd    *exec.Cmd
	log    *os.File
	done   chan struct{}
	err    error
	exited time.Time
}

// StartProcess starts a program in a process group of its own. It is
// killed if the calling process dies (Linux parent-death signal), so a
// crashed run leaves nothing behind.
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
	fmt.Fprintf(f, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), opts.Path, strings.Join(opts.Args, " "))
	// Not tied to a context: the caller stops the process with Stop or Kill.
	cmd := exec.CommandContext(context.Background(), opts.Path, opts.Args...) //nolint:gosec // runs the binaries the caller built
	cmd.Env = append(os.Environ(), opts.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	// A process group of its own keeps a terminal's Ctrl-C away from it:
	// the caller decides how and when its processes stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", opts.Name, err)
	}
	p := &Process{Name: opts.Name, LogPath: logPath, cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		p.exited = time.Now()
		fmt.Fprintf(f, "=== %s: exited: %v\n", time.Now().Format(time.RFC3339Nano), p.cmd.ProcessState)
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitTime returns when the process exited, false while it runs.
func (p *Process) ExitTime() (time.Time, bool) {
	if !p.Exited() {
		return time.Time{}, false
	}
	return p.exited, true
}

// ExitError returns the process's exit error once it exited (nil for a
// clean exit).
func (p *Process) ExitError() error {
	<-p.done
	return p.err
}

// Stop sends SIGTERM and waits up to timeout for a graceful exit, then
// sends SIGKILL. It returns an error if the process had to be killed or
// exited with an error.
func (p *Process) Stop(timeout time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("%s exited after SIGTERM: %w", p.Name, p.err)
		}
		return nil
	case <-time.After(timeout):
		_ = p.Kill()
		return fmt.Errorf("%s did not exit within %s of SIGTERM and was killed", p.Name, timeout)
	}
}

// Signal sends sig to the process (e.g. SIGSTOP to freeze it, SIGCONT to
// resume it).
func (p *Process) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signalling %s: %w", p.Name, err)
	}
	return nil
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() error {
	if p.Exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s: %w", p.Name, err)
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

// Memory is a process's resident memory from /proc/<pid>/status.
type Memory struct {
	// RSS is the current resident set size (VmRSS) in bytes.
	RSS uint64
	// Peak is the peak resident set size (VmHWM) in bytes.
	Peak uint64
}

// Memory reads the process's resident memory (Linux only).
func (p *Process) Memory() (Memory, error) {
	return ReadMemory(p.Pid())
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

// KillAll kills every tracked process that still runs.
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
