package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// packages are the Debian packages the node needs, by a file each installs.
var packages = []struct{ file, name string }{
	{"/usr/sbin/runc", "runc"},
	{"/usr/lib/cni/bridge", "containernetworking-plugins"},
	{"/usr/sbin/iptables", "iptables"},
	{"/usr/sbin/conntrack", "conntrack"},
	// Debian's iptables is iptables-nft: nft removes the tables it creates.
	{"/usr/sbin/nft", "nftables"},
}

// ensurePackages installs the missing packages with apt-get.
func ensurePackages(ctx context.Context) error {
	var missing []string
	for _, p := range packages {
		if _, err := os.Stat(p.file); err != nil {
			missing = append(missing, p.name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if !hasCommand("apt-get") {
		return fmt.Errorf("the node needs these packages and there is no apt-get to install them: %s", strings.Join(missing, " "))
	}
	fmt.Printf("installing %s\n", strings.Join(missing, " "))
	for _, args := range [][]string{{"update"}, append([]string{"install", "-y", "--no-install-recommends"}, missing...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...) //nolint:gosec // fixed package names
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", args[0], err, out)
		}
	}
	return nil
}

// sysctls are the kernel settings the kubelet, kube-proxy and the bridge
// plugin may change; up saves them and down puts them back.
var sysctls = []string{
	"kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory", "vm.panic_on_oom",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
	"net.ipv4.ip_forward", "net.ipv4.conf.all.route_localnet",
	"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables",
}

// hostPaths are folders outside the state folder that the kubelet and
// containerd create or write to whatever they are told: log symlinks, the
// device plugins' socket, shim sockets, CNI results, and util-linux's mount
// table (the kubelet runs mount).
var hostPaths = []string{"/var/log/containers", "/var/log/pods", "/var/lib/kubelet", "/run/containerd", "/var/lib/cni", "/run/mount"}

// hostState is what the host looked like before the cluster started.
type hostState struct {
	// Sysctls holds the value of each setting that exists.
	Sysctls map[string]string `json:"sysctls"`
	// Created lists the hostPaths that did not exist.
	Created []string `json:"created"`
	// NFTables lists the nftables tables ("ip nat") that existed.
	NFTables []string `json:"nftables"`
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

// saveHost records the host's state in DIR/host.json. It keeps an existing
// record: that one was written before an earlier cluster changed anything.
func saveHost(ctx context.Context, l layout) error {
	path := l.path("host.json")
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	s := hostState{Sysctls: map[string]string{}}
	for _, key := range sysctls {
		if v, err := os.ReadFile(sysctlPath(key)); err == nil {
			s.Sysctls[key] = strings.TrimSpace(string(v))
		}
	}
	for _, p := range hostPaths {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			s.Created = append(s.Created, p)
		}
	}
	tables, err := nftTables(ctx)
	if err != nil {
		return err
	}
	s.NFTables = tables
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

func loadHost(l layout) (*hostState, error) {
	data, err := os.ReadFile(l.path("host.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s hostState
	return &s, json.Unmarshal(data, &s)
}

// mountInfo returns the mount points and file system types of this mount
// namespace.
func mountInfo() ([][2]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var mounts [][2]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		mounts = append(mounts, [2]string{unescapeMount(fields[4]), fields[sep+1]})
	}
	return mounts, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cgroupMounts returns the mount point of every cgroup hierarchy.
func cgroupMounts() ([]string, error) {
	mounts, err := mountInfo()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, m := range mounts {
		if m[1] == "cgroup" || m[1] == "cgroup2" {
			dirs = append(dirs, m[0])
		}
	}
	return dirs, nil
}

// createCgroups creates the kubelet's cgroup root in every hierarchy. A new
// cpuset cgroup has no CPUs or memory nodes: it gets its parent's.
func createCgroups() error {
	dirs, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, d := range dirs {
		own := filepath.Join(d, cgroupRoot)
		if err := os.MkdirAll(own, 0o755); err != nil { //nolint:gosec // a cgroup, as the kubelet makes them
			return fmt.Errorf("creating cgroup %s: %w", own, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(own, f), v, 0o644); err != nil { //nolint:gosec // a cgroup file: the mode is not used
				return fmt.Errorf("setting %s: %w", filepath.Join(own, f), err)
			}
		}
	}
	return nil
}

// cgroupProcesses returns the processes in the kubelet's cgroups: the pods'
// containers.
func cgroupProcesses() []int {
	dirs, _ := cgroupMounts()
	var pids []int
	for _, d := range dirs {
		_ = filepath.WalkDir(filepath.Join(d, cgroupRoot), func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				return fs.SkipDir // gone, or never made
			}
			if !e.IsDir() {
				return nil
			}
			data, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups removes the kubelet's cgroups, deepest first.
func removeCgroups() error {
	dirs, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		var all []string
		_ = filepath.WalkDir(filepath.Join(d, cgroupRoot), func(path string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, path)
			}
			return nil
		})
		sort.Slice(all, func(i, j int) bool { return len(all[i]) > len(all[j]) })
		for _, p := range all {
			// A cgroup whose last process just ended may still be busy.
			var err error
			for i := 0; i < 20; i++ {
				if err = syscall.Rmdir(p); err == nil || errors.Is(err, fs.ErrNotExist) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountAll unmounts everything mounted under dir, deepest first, and fails
// if anything is left.
func unmountAll(dir string) error {
	for pass := 0; pass < 5; pass++ {
		mounts, err := mountInfo()
		if err != nil {
			return err
		}
		var under []string
		for _, m := range mounts {
			if m[0] == dir || strings.HasPrefix(m[0], dir+"/") {
				under = append(under, m[0])
			}
		}
		if len(under) == 0 {
			return nil
		}
		sort.Slice(under, func(i, j int) bool { return len(under[i]) > len(under[j]) })
		for _, p := range under {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, fs.ErrNotExist) {
				fmt.Printf("unmounting %s: %v\n", p, err)
			}
		}
	}
	return fmt.Errorf("mounts are left under %s (see /proc/self/mountinfo)", dir)
}

// iptablesChain tells the chains the cluster creates: kube-proxy's and the
// kubelet's (KUBE-*) and the CNI plugins' (CNI-*).
func iptablesChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")
}

// cleanIptables removes, in every table of iptables and ip6tables, the rules
// that jump to the cluster's chains, then those chains.
func cleanIptables(ctx context.Context) error {
	var errs []error
	for _, bin := range []string{"iptables", "ip6tables"} {
		if !hasCommand(bin) {
			continue
		}
		for _, table := range []string{"filter", "nat", "mangle", "raw"} {
			out, err := exec.CommandContext(ctx, bin, "-w", "-t", table, "-S").Output() //nolint:gosec // iptables or ip6tables
			if err != nil {
				continue // the table or the protocol is not there
			}
			var chains []string
			var jumps [][]string
			for _, line := range strings.Split(string(out), "\n") {
				words := shellWords(line)
				if len(words) < 2 {
					continue
				}
				switch {
				case words[0] == "-N" && iptablesChain(words[1]):
					chains = append(chains, words[1])
				case words[0] == "-A" && !iptablesChain(words[1]) && jumpsToOurs(words):
					jumps = append(jumps, words)
				}
			}
			for _, rule := range jumps {
				args := append([]string{"-w", "-t", table, "-D"}, rule[1:]...)
				if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil { //nolint:gosec // deleting a rule iptables listed
					errs = append(errs, fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, out))
				}
			}
			for _, op := range []string{"-F", "-X"} {
				for _, c := range chains {
					if out, err := exec.CommandContext(ctx, bin, "-w", "-t", table, op, c).CombinedOutput(); err != nil { //nolint:gosec // a chain iptables listed
						errs = append(errs, fmt.Errorf("%s -t %s %s %s: %w: %s", bin, table, op, c, err, out))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

func hasCommand(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}

// iptablesTables are the nftables tables iptables-nft creates on first use.
var iptablesTables = []string{"filter", "nat", "mangle", "raw", "security"}

// nftTables returns the nftables tables, as "family name".
func nftTables(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").Output() //nolint:gosec // fixed arguments
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w", err)
	}
	var tables []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables, nil
}

// removeNFTables deletes the iptables tables that the cluster's use of
// iptables-nft created (they did not exist before it started). Their chains
// are already gone; what is left are empty base chains.
func removeNFTables(ctx context.Context, s *hostState) error {
	if s == nil || !hasCommand("nft") {
		return nil
	}
	tables, err := nftTables(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tables {
		family, name, _ := strings.Cut(t, " ")
		if slices.Contains(s.NFTables, t) || (family != "ip" && family != "ip6") || !slices.Contains(iptablesTables, name) {
			continue
		}
		if out, err := exec.CommandContext(ctx, "nft", "delete", "table", family, name).CombinedOutput(); err != nil { //nolint:gosec // a table nft listed
			errs = append(errs, fmt.Errorf("nft delete table %s: %w: %s", t, err, out))
		}
	}
	return errors.Join(errs...)
}

func jumpsToOurs(words []string) bool {
	for i, w := range words {
		if (w == "-j" || w == "-g") && i+1 < len(words) && iptablesChain(words[i+1]) {
			return true
		}
	}
	return false
}

// shellWords splits an iptables -S line, which quotes comments with double
// quotes.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && inQuote && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			inQuote, have = !inQuote, true
		case c == ' ' && !inQuote:
			if have {
				words = append(words, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if have {
		words = append(words, cur.String())
	}
	return words
}

// removeBridge deletes the CNI bridge; the pods' veths went with their
// network namespaces.
func removeBridge(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join("/sys/class/net", bridgeName)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "ip", "link", "delete", bridgeName).CombinedOutput(); err != nil { //nolint:gosec // fixed arguments
		return fmt.Errorf("deleting the bridge %s: %w: %s", bridgeName, err, out)
	}
	return nil
}

// cleanHostPaths removes what the cluster left outside the state folder: the
// kubelet's symlinks to its pod logs, containerd's shim sockets, the CNI's
// results, and the folders that were not there before (when known).
func cleanHostPaths(l layout, s *hostState) error {
	var errs []error
	entries, _ := os.ReadDir("/var/log/containers")
	for _, e := range entries {
		p := filepath.Join("/var/log/containers", e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, l.dir+"/") {
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	results, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", cniNetwork+"-*"))
	for _, r := range results {
		if err := os.Remove(r); err != nil {
			errs = append(errs, err)
		}
	}
	if s != nil {
		for _, p := range s.Created {
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// restoreSysctls writes back the saved kernel settings.
func restoreSysctls(s *hostState) error {
	if s == nil {
		return nil
	}
	var errs []error
	for key, v := range s.Sysctls {
		cur, err := os.ReadFile(sysctlPath(key))
		if err != nil || strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile(sysctlPath(key), []byte(v), 0o644); err != nil { //nolint:gosec // a sysctl: the mode is not used
			errs = append(errs, fmt.Errorf("restoring %s=%s: %w", key, v, err))
		}
	}
	return errors.Join(errs...)
}
