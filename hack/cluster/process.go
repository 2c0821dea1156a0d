package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a started process. exited is closed once it ends; up uses it to
// fail fast instead of waiting for a component that has died.
type proc struct {
	name   string
	pid    int
	exited chan struct{}
	err    error
}

// start runs a component in a session of its own, so that it outlives this
// command and no terminal signal reaches it, with its output in
// DIR/logs/NAME.log and its PID in DIR/pids/NAME.pid.
func start(l layout, name, binary string, args []string, pathDirs ...string) (*proc, error) {
	for _, d := range []string{"logs", "pids"} {
		if err := os.MkdirAll(l.path(d), 0o750); err != nil {
			return nil, err
		}
	}
	log, err := os.OpenFile(l.path("logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }()
	// Not bound to a context: the component outlives this command.
	cmd := exec.CommandContext(context.Background(), binary, args...) //nolint:gosec // a component built by make
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = append(os.Environ(), "PATH="+strings.Join(append(pathDirs, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"), ":"))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	if err := os.WriteFile(l.path("pids", name+".pid"), []byte(strconv.Itoa(p.pid)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

// failed returns an error with the end of the log if the process has ended.
func (p *proc) failed(l layout) error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited (%w); the end of %s:\n%s", p.name, p.err, l.path("logs", p.name+".log"), tail(l.path("logs", p.name+".log"), 15))
	default:
		return nil
	}
}

func tail(path string, lines int) string {
	data, _ := os.ReadFile(path)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// running is a process of the cluster found in /proc.
type running struct {
	pid  int
	name string
}

// findProcesses returns the cluster's processes: those named like a
// component whose command line mentions the state folder. It never returns
// this process or its ancestors (go run, make, a test binary), whose command
// lines may mention the folder too.
func findProcesses(l layout) []running {
	skip := map[int]bool{}
	for pid := os.Getpid(); pid > 1 && !skip[pid]; pid = parentOf(pid) {
		skip[pid] = true
	}
	entries, _ := os.ReadDir("/proc")
	var found []running
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || skip[pid] {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue // gone, or a kernel thread
		}
		argv := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
		name := filepath.Base(string(argv[0]))
		if !slices.Contains(components, name) || !bytes.Contains(cmdline, []byte(l.dir)) {
			continue
		}
		found = append(found, running{pid: pid, name: name})
	}
	return found
}

func parentOf(pid int) int {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// alive reports whether pid runs (a zombie has ended: only its parent's wait
// is missing).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// stopGrace is how long stop waits between SIGTERM and SIGKILL.
const stopGrace = 10 * time.Second

// stop sends SIGTERM to every pid, waits up to stopGrace for them to end,
// then kills those left.
func stop(pids []int) {
	grace := stopGrace
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !slices.ContainsFunc(pids, alive) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, pid := range pids {
		if alive(pid) {
			fmt.Printf("killing %d: it did not stop within %s\n", pid, grace)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for i := 0; i < 50 && slices.ContainsFunc(pids, alive); i++ {
		time.Sleep(100 * time.Millisecond)
	}
}
