package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// etcdView is what etcd itself reported about a cluster in one reconcile.
type etcdView struct {
	// err is why etcd did not answer the member list; nil when it did.
	err error
	// clusterID and leaderID as etcd reports them; 0 when unknown.
	clusterID, leaderID uint64
	// members is etcd's member list, in its order.
	members []etcdMemberView
}

// etcdMemberView is one entry of etcd's member list, with whether the member
// itself answered.
type etcdMemberView struct {
	id         uint64
	name       string
	peerURLs   []string
	clientURLs []string
	learner    bool
	// healthy: the member answered a status request at one of the
	// endpoints, in the same cluster, knowing a leader, without errors.
	healthy bool
	// endpoint is where it answered and version the etcd version it
	// reported; both "" unless healthy.
	endpoint, version string
}

// answered reports whether etcd answered the (linearizable, so quorum-backed)
// member list.
func (v etcdView) answered() bool { return v.err == nil }

// voters is the number of voting members etcd lists.
func (v etcdView) voters() int32 {
	var n int32
	for _, m := range v.members {
		if !m.learner {
			n++
		}
	}
	return n
}

// healthyVoters is the number of voting members that answered.
func (v etcdView) healthyVoters() int32 {
	var n int32
	for _, m := range v.members {
		if !m.learner && m.healthy {
			n++
		}
	}
	return n
}

// member returns the listed member with id, if any.
func (v etcdView) member(id uint64) (etcdMemberView, bool) {
	for _, m := range v.members {
		if m.id == id {
			return m, true
		}
	}
	return etcdMemberView{}, false
}

// formatID writes an etcd ID as etcdctl does: hexadecimal.
func formatID(id uint64) string {
	if id == 0 {
		return ""
	}
	return strconv.FormatUint(id, 16)
}

// errNoEndpoints: no member pod has an address yet, so there is nobody to ask.
var errNoEndpoints = errors.New("no member has an address yet")

// etcdAccess is how the operator authenticates to a cluster's etcd. The zero
// value is plain HTTP without credentials. clusterAccess (security.go)
// returns a cluster's.
type etcdAccess struct {
	// TLS, when set, is the client's TLS configuration (server CA and, for
	// client certificate authentication, the operator's certificate).
	TLS *tls.Config
	// Username and Password, when set, authenticate with etcd's basic auth.
	Username, Password string
}

// newEtcdClient opens a client to a cluster's etcd at endpoints (client URLs
// of its members). Every connection the operator makes to etcd is opened
// here. The client lives as long as ctx or until it is closed; dialing is
// bounded by timeout.
func newEtcdClient(ctx context.Context, access etcdAccess, endpoints []string, timeout time.Duration) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		return nil, errNoEndpoints
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: timeout,
		Context:     ctx,
		TLS:         access.TLS,
		Username:    access.Username,
		Password:    access.Password,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}

// observeEtcd asks etcd, through endpoints (client URLs of the members), for
// its member list, then asks every endpoint for its own status. Every call is
// bounded by timeout and by ctx; the client is closed before it returns.
func observeEtcd(ctx context.Context, access etcdAccess, endpoints []string, timeout time.Duration) etcdView {
	if len(endpoints) == 0 {
		return etcdView{err: errNoEndpoints}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cli, err := newEtcdClient(ctx, access, endpoints, timeout)
	if err != nil {
		return etcdView{err: err}
	}
	defer func() { _ = cli.Close() }()

	list, err := cli.MemberList(ctx)
	if err != nil {
		return etcdView{err: fmt.Errorf("etcd member list: %w", err)}
	}
	view := etcdView{clusterID: list.Header.GetClusterId()}
	for _, m := range list.Members {
		view.members = append(view.members, etcdMemberView{
			id: m.ID, name: m.Name, peerURLs: m.PeerURLs, clientURLs: m.ClientURLs, learner: m.IsLearner,
		})
	}

	// Each endpoint answers for the member behind it.
	type answer struct {
		member, leader    uint64
		endpoint, version string
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	for _, ep := range endpoints {
		wg.Go(func() {
			st, err := cli.Status(ctx, ep)
			if err != nil || st.Header == nil || st.Header.ClusterId != view.clusterID || st.Leader == 0 || len(st.Errors) > 0 {
				return
			}
			mu.Lock()
			answers = append(answers, answer{member: st.Header.MemberId, leader: st.Leader, endpoint: ep, version: st.Version})
			mu.Unlock()
		})
	}
	wg.Wait()

	// The leader is the one most healthy members follow (they agree but
	// during an election).
	votes := map[uint64]int{}
	for _, a := range answers {
		for i := range view.members {
			if view.members[i].id == a.member {
				view.members[i].healthy = true
				view.members[i].endpoint, view.members[i].version = a.endpoint, a.version
			}
		}
		votes[a.leader]++
	}
	for id, n := range votes {
		if n > votes[view.leaderID] || (n == votes[view.leaderID] && id < view.leaderID) {
			view.leaderID = id
		}
	}
	return view
}

// memberEndpoints are the client URLs of a cluster's member pods that have an
// address, by pod IP: the operator reaches each member directly, needing
// neither cluster DNS nor the client Service.
func memberEndpoints(c *etcdv1alpha1.EtcdCluster, pods []corev1.Pod) []string {
	port := strconv.Itoa(int(spec(c).Network.ClientPort))
	var out []string
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			continue
		}
		out = append(out, clientScheme(spec(c))+"://"+net.JoinHostPort(p.Status.PodIP, port))
	}
	sort.Strings(out)
	return out
}
