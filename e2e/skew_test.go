package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

const (
	// skewFromEnv names the revision whose instances TestSkewPreviousInstances
	// runs, instead of the previous release (make test-skew SKEW_FROM=...).
	skewFromEnv = "SKEW_FROM"
	// skewBaselineFile holds the revision used while no release is tagged.
	skewBaselineFile = "hack/skew/baseline"
	// skewInstancePackage is the instance program built from the earlier
	// revision: the example operator, which the end-to-end suite of every
	// revision since pkg/instance exists runs as its instances.
	skewInstancePackage = localrun.OperatorPackage
)

// TestSkewPreviousInstances runs the sharder of this tree with instances
// built from the previous release's pkg/instance (docs/versioning.md,
// "Version skew"): the previous release is the newest tag v* that is an
// ancestor of HEAD, other than a tag of HEAD itself, or the revision of
// hack/skew/baseline while no release is tagged; SKEW_FROM names another.
// Two earlier instances get every object; a third joins and takes its share
// through drains the earlier instances acknowledge (none forced); one of the
// first two stops and its objects move to the others, which keep theirs. No
// object is ever reconciled by two instances at once, and each ends
// reconciled by the instance it is assigned to.
func TestSkewPreviousInstances(t *testing.T) {
	const (
		objects = 30
		timeout = 90 * time.Second
	)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rev, from := previousRelease(t, root)
	start := time.Now()
	bin := buildAtRevision(t, root, rev, skewInstancePackage, filepath.Join(cluster.Dir, "bin"))
	t.Logf("instances built from %s (%s) in %s", rev, from, time.Since(start).Round(time.Millisecond))

	// A generous drain timeout: an acknowledgement slowed by a loaded
	// machine must not pass for a forced move.
	e := newRingEnv(t, ringOptions{InstanceBinary: bin, DrainTimeout: 30 * time.Second})
	history := watchLabelHistory(t, e)
	e.startInstances(2)
	e.startSharders()
	e.createClusters("obj", objects)
	before := e.waitSettled(objects, timeout)
	e.expectReady(timeout)
	e.expectReconciledByOwner(timeout)

	// Scale-out: only objects that move to the new instance move, each
	// drained first.
	added := "instance-2"
	e.startInstance(added)
	out := e.waitSettled(objects, timeout)
	e.expectReady(timeout)
	prev := before.ByKey()
	movedOut := 0
	for _, o := range out {
		if prev[o.Key] != o.Instance {
			movedOut++
			e.g.Expect(o.Instance).To(gomega.Equal(added), "%s moved from %s to %s, not to the new instance", o.Key, prev[o.Key], o.Instance)
		}
	}
	e.g.Expect(movedOut).To(gomega.BeNumerically(">", 0), "the new instance got no objects")
	e.expectReconciledByOwner(timeout)

	// Scale-in: the stopped instance releases its Lease, its objects move
	// to the others at once (its Lease is released, no drain needed), and
	// nothing else moves.
	stopped := "instance-0"
	stoppedAt := time.Now()
	e.stopInstance(stopped)
	e.g.Expect(ptr.Deref(e.lease(stopped).Spec.HolderIdentity, "")).To(gomega.Or(gomega.BeEmpty(), gomega.HavePrefix("sharder:")),
		"a stopped instance of the earlier release releases its Lease")
	in := e.waitSettled(objects, timeout, e.liveInstances()...)
	outBy := out.ByKey()
	for _, o := range in {
		if outBy[o.Key] != stopped {
			e.g.Expect(o.Instance).To(gomega.Equal(outBy[o.Key]), "%s was not on the stopped instance but moved", o.Key)
		}
	}
	e.g.Expect(localrun.Moved(out, in)).To(gomega.Equal(out.Counts()[stopped]))
	e.expectReconciledByOwner(timeout)
	ivs := e.expectNoOverlap()

	// How each object left its instance, from the labels' history.
	restarted := e.restartCounts()
	m := history.moves()
	for _, f := range m.forced {
		t.Errorf("forced move: %s", f)
	}
	for _, u := range m.undrained {
		// Only the stopped instance's objects move without a drain, after
		// its stop; so may an instance's that lost its Lease on a loaded
		// machine and was restarted.
		if (u.from.shard == stopped && !u.to.at.Before(stoppedAt)) || restarted[e.ring+"-"+u.from.shard] > 0 {
			continue
		}
		t.Errorf("moved without a drain: %s", u)
	}
	e.g.Expect(m.acknowledged).To(gomega.BeNumerically(">=", movedOut), "drains acknowledged by the earlier instances")
	t.Logf("skew %s: %d objects, %d moved by the scale-out (%d drains acknowledged, %d forced), %d by the scale-in; %d reconciles checked; restarted %v",
		rev[:12], objects, movedOut, m.acknowledged, len(m.forced), out.Counts()[stopped], len(ivs), restarted)
}

// expectReady waits until every live instance's Lease is ready as the
// sharder sees it.
func (e *ringEnv) expectReady(timeout time.Duration) {
	e.t.Helper()
	e.g.Eventually(func() error {
		leases, err := localrun.ListLeases(e.ctx, e.c, e.leaseNamespace, e.ring)
		if err != nil {
			return err
		}
		states := map[string]string{}
		for _, l := range leases {
			states[l.Name] = l.State
		}
		for _, id := range e.liveInstances() {
			if states[id] != string(membership.StateReady) {
				return fmt.Errorf("instance %s is %q, not ready (Leases: %v)", id, states[id], states)
			}
		}
		return nil
	}).WithTimeout(timeout).WithPolling(200 * time.Millisecond).Should(gomega.Succeed())
}

// previousRelease returns the revision whose instances the skew test runs
// and where it came from. It skips the test outside a git checkout, and in
// a shallow clone that lacks the revision.
func previousRelease(t *testing.T, root string) (rev, from string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("version skew: git is not installed, so no earlier revision can be read")
	}
	top, err := git(root, "rev-parse", "--show-toplevel")
	if err != nil || !sameDir(strings.TrimSpace(top), root) {
		t.Skipf("version skew: the tree is not a git checkout, so no earlier revision can be read (%v)", err)
	}
	switch {
	case os.Getenv(skewFromEnv) != "":
		rev, from = os.Getenv(skewFromEnv), "$"+skewFromEnv
	default:
		tags, err := git(root, "tag", "--merged", "HEAD", "--no-contains", "HEAD", "--list", "v*", "--sort=-v:refname")
		if err != nil {
			t.Fatalf("version skew: listing the release tags: %v", err)
		}
		if fields := strings.Fields(tags); len(fields) > 0 {
			rev, from = fields[0], fields[0]+", the newest release tag before HEAD"
			break
		}
		rev, err = readBaseline(filepath.Join(root, skewBaselineFile))
		if err != nil {
			t.Fatalf("version skew: no release tag is an ancestor of HEAD, and the baseline: %v", err)
		}
		from = "no release tagged yet: " + skewBaselineFile
	}
	full, err := git(root, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		shallow, _ := git(root, "rev-parse", "--is-shallow-repository")
		if strings.TrimSpace(shallow) == "true" {
			t.Skipf("version skew: this shallow clone lacks %s (%s); fetch the history (git fetch --unshallow --tags) to run the test", rev, from)
		}
		t.Fatalf("version skew: revision %s (%s) is not in the repository", rev, from)
	}
	return strings.TrimSpace(full), from
}

// sameDir reports whether a and b name the same folder.
func sameDir(a, b string) bool {
	ia, errA := os.Stat(a)
	ib, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(ia, ib)
}

// readBaseline reads the revision of the baseline file: its first line that
// is neither empty nor a comment.
func readBaseline(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := strings.TrimSpace(s.Text()); line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s names no revision", path)
}

// git runs git in dir and returns its output. safe.directory lets a test
// run as root (CI) read a checkout someone else owns.
func git(dir string, args ...string) (string, error) {
	args = append([]string{"-c", "safe.directory=" + dir, "-C", dir}, args...)
	cmd := exec.CommandContext(context.Background(), "git", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// buildAtRevision builds pkg as it is at revision rev of the repository at
// root and returns the path of a copy of the binary in outDir. The
// revision's files are extracted into a folder named after it, under a
// lock, and removed once built: the folder's path is the same on every run,
// so Go's build cache, which keys packages by their folder, serves every
// build after the first. The binary goes to a path named after the revision
// too, which go build leaves untouched while it is up to date, saving the
// link; each run copies it, so that a later build never replaces a binary
// a run's processes execute.
func buildAtRevision(t *testing.T, root, rev, pkg, outDir string) string {
	t.Helper()
	src := filepath.Join(os.TempDir(), "sharder-skew-"+rev)
	lock, err := os.OpenFile(src+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("locking %s: %v", lock.Name(), err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if err := os.RemoveAll(src); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(src) }()
	if err := extractRevision(root, rev, src); err != nil {
		t.Fatalf("extracting %s: %v", rev, err)
	}
	if err := os.MkdirAll(outDir, 0o750); err != nil {
		t.Fatal(err)
	}
	built := filepath.Join(src+".bin", filepath.Base(pkg))
	dir, rel, err := localrun.ModuleOf(src, pkg)
	if err != nil {
		t.Fatalf("%s at %s: %v", pkg, rev, err)
	}
	cmd := exec.CommandContext(context.Background(), "go", "build", "-ldflags=-s -w", "-o", built, rel)
	cmd.Dir = dir
	// The revision's own modules alone (each sub-module replaces the root
	// module with its folder), not this tree's workspace.
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "GOWORK=off")
	output, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("building %s at %s: %v\n%s", pkg, rev, err, output)
	}
	out := filepath.Join(outDir, filepath.Base(pkg)+"-"+rev[:12])
	if err := copyExecutable(built, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// copyExecutable copies the program at from to to.
func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o700)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// extractRevision writes the files of revision rev into dir (git archive).
func extractRevision(root, rev, dir string) error {
	cmd := exec.CommandContext(context.Background(), "git", "-c", "safe.directory="+root, "-C", root, "archive", "--format=tar", rev)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	extractErr := untar(stdout, dir)
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", rev, err, strings.TrimSpace(stderr.String()))
	}
	return extractErr
}

// untar writes the regular files, folders and symbolic links of a tar
// stream under dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, ".."+string(filepath.Separator)) {
			return fmt.Errorf("archive entry %q leaves the folder", h.Name)
		}
		path := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o750); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode&0o755)|0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				_ = f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, path); err != nil {
				return err
			}
		}
	}
}

// labelHistory records every change of the ring's shard and drain labels
// on the EtcdClusters of a scenario, in the order the watch delivers them.
type labelHistory struct {
	ring string

	mu     sync.Mutex
	states map[string][]labelState
}

// labelState is one object's ring labels from one watch event on.
type labelState struct {
	at           time.Time
	shard, drain string
}

// watchLabelHistory starts recording the label history of e's EtcdClusters
// until the scenario ends.
func watchLabelHistory(t *testing.T, e *ringEnv) *labelHistory {
	t.Helper()
	h := &labelHistory{ring: e.ring, states: map[string][]labelState{}}
	mc, err := metadata.NewForConfig(cluster.ControlPlane.Config)
	if err != nil {
		t.Fatal(err)
	}
	informer := metadatainformer.NewFilteredMetadataInformer(mc, etcdClusters, e.namespace, 0, cache.Indexers{}, nil).Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    h.observe,
		UpdateFunc: func(_, obj any) { h.observe(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	go informer.Run(e.ctx.Done())
	if !cache.WaitForCacheSync(e.ctx.Done(), informer.HasSynced) {
		t.Fatal("label history: the watch did not sync")
	}
	return h
}

func (h *labelHistory) observe(obj any) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	s := labelState{at: time.Now(), shard: m.Labels[sharderv1alpha1.ShardLabel(h.ring)], drain: m.Labels[sharderv1alpha1.DrainLabel(h.ring)]}
	key := m.Namespace + "/" + m.Name
	h.mu.Lock()
	defer h.mu.Unlock()
	if states := h.states[key]; len(states) > 0 {
		last := states[len(states)-1]
		if last.shard == s.shard && last.drain == s.drain {
			return
		}
	}
	h.states[key] = append(h.states[key], s)
}

// labelMove is one object leaving its instance.
type labelMove struct {
	key      string
	from, to labelState
}

func (m labelMove) String() string {
	return fmt.Sprintf("%s at %s: shard %q drain %q -> shard %q drain %q", m.key, m.to.at.Format(time.RFC3339Nano), m.from.shard, m.from.drain, m.to.shard, m.to.drain)
}

// labelMoves sorts the ways objects left their instances.
type labelMoves struct {
	// acknowledged drains: the instance removed the drain label as the
	// object left it (handed over, or both labels removed).
	acknowledged int
	// forced releases: the shard label removed while the drain label stays,
	// which only the sharder does, when a drain timed out.
	forced []labelMove
	// undrained moves: the shard label changed on an object that was not
	// draining.
	undrained []labelMove
}

// moves reads the history recorded so far.
func (h *labelHistory) moves() labelMoves {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out labelMoves
	for key, states := range h.states {
		for i := 1; i < len(states); i++ {
			prev, cur := states[i-1], states[i]
			if prev.shard == "" || cur.shard == prev.shard {
				continue
			}
			m := labelMove{key: key, from: prev, to: cur}
			switch {
			case prev.drain != "" && cur.drain == "":
				out.acknowledged++
			case prev.drain != "" && cur.shard == "":
				out.forced = append(out.forced, m)
			default:
				out.undrained = append(out.undrained, m)
			}
		}
	}
	return out
}
