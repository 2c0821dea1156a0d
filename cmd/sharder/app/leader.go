package app

import (
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/sharder-dev/sharder/pkg/sharder/config"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// leaderLock is the leader-election lock of `sharder run`. The sharder
// makes it rather than leaving it to controller-runtime so that the
// replica knows its own identity in the election: its label writes carry
// it as their field manager, and every replica's webhook admits the
// sharder's label writes only from the Lease's current holder
// (docs/design.md §6). A nil *leaderLock is leader election off:
// no lock, no identity, no fencing.
type leaderLock struct {
	identity string
	lease    types.NamespacedName
	res      resourcelock.Interface
	events   *laterRecorder
}

// newLeaderLock returns the lock of le, nil when leader election is off.
func newLeaderLock(cfg *rest.Config, le config.LeaderElection) (*leaderLock, error) {
	if !le.Enabled {
		return nil, nil
	}
	id, err := leaderIdentity()
	if err != nil {
		return nil, err
	}
	// As controller-runtime's own lock: a user agent of its own, and a
	// client timeout well inside the renew deadline, so that one hung
	// request does not cost the leadership.
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	cfg.Timeout = max(le.RenewDeadline.Duration/2, time.Second)
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the leader election client: %w", err)
	}
	coordination, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the leader election client: %w", err)
	}
	events := &laterRecorder{}
	// The election writes the label with every acquisition and renewal, so
	// the Lease names the version of the replica that last wrote it, and
	// `sharder version` finds it by the label.
	lock, err := resourcelock.NewWithLabels(resourcelock.LeasesResourceLock, le.Namespace, le.LeaseName, core, coordination,
		resourcelock.ResourceLockConfig{Identity: id, EventRecorder: events}, map[string]string{labelVersion: versionLabelValue(Version())})
	if err != nil {
		return nil, fmt.Errorf("creating the leader election lock: %w", err)
	}
	return &leaderLock{identity: id, lease: types.NamespacedName{Namespace: le.Namespace, Name: le.LeaseName}, res: lock, events: events}, nil
}

// maxHostname bounds the host name in the identity, so that the field
// manager built from it stays within the API server's 128 characters.
const maxHostname = 63

// leaderIdentity is the replica's identity in the election, unique per
// process as controller-runtime's: the host name (a pod's name) and a
// random UUID.
func leaderIdentity() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("reading the host name for the leader election identity: %w", err)
	}
	if len(host) > maxHostname {
		host = host[:maxHostname]
	}
	return host + "_" + string(uuid.NewUUID()), nil
}

func (l *leaderLock) lock() resourcelock.Interface {
	if l == nil {
		return nil
	}
	return l.res
}

// fieldManager is the field manager of the replica's writes, "" without
// leader election.
func (l *leaderLock) fieldManager() string {
	if l == nil {
		return ""
	}
	return webhook.LeaderFieldManager(l.identity)
}

// key names the leader-election Lease the webhook watches; zero without
// leader election.
func (l *leaderLock) key() types.NamespacedName {
	if l == nil {
		return types.NamespacedName{}
	}
	return l.lease
}

// setRecorder makes the election record its events (became leader, ...)
// with rec, which is made once the manager exists.
func (l *leaderLock) setRecorder(rec record.EventRecorder) {
	if l != nil {
		l.events.rec.Store(&rec)
	}
}

// laterRecorder records events with a recorder set after it was made; it
// drops those that come before.
type laterRecorder struct {
	rec atomic.Pointer[record.EventRecorder]
}

var _ resourcelock.EventRecorder = &laterRecorder{}

func (r *laterRecorder) Eventf(obj runtime.Object, eventType, reason, message string, args ...any) {
	if rec := r.rec.Load(); rec != nil {
		(*rec).Eventf(obj, eventType, reason, message, args...)
	}
}
