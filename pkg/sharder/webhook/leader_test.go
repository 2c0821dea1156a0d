package webhook

import (
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

func leaderLease(holder string, renewed time.Time, seconds int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(holder),
		RenewTime:            ptr.To(metav1.NewMicroTime(renewed)),
		LeaseDurationSeconds: ptr.To(seconds),
	}}
}

// TestLeaderView: the leader is the Lease's holder while this replica saw
// its last renewal less than the Lease's duration ago, on its own clock,
// whatever the times written on the Lease say; the same record seen again
// (a resync, a replica frozen meanwhile) does not count as a renewal.
func TestLeaderView(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	v := &leaderView{key: types.NamespacedName{Namespace: "sharder-system", Name: "sharder"}, clock: clk}
	expect := func(want string) {
		t.Helper()
		got, why := v.leader()
		if got != want {
			t.Fatalf("leader = %q (%s), want %q", got, why, want)
		}
		if got == "" && !strings.Contains(why, "sharder-system/sharder") {
			t.Errorf("why %q does not name the Lease", why)
		}
	}
	expect("")

	// Written an hour ago by a clock that lags: observed now, it counts.
	renewed := clk.Now().Add(-time.Hour)
	v.observe(leaderLease("a_1", renewed, 4))
	expect("a_1")
	clk.SetTime(clk.Now().Add(3 * time.Second))
	v.observe(leaderLease("a_1", renewed, 4)) // the same record again
	expect("a_1")
	clk.SetTime(clk.Now().Add(time.Second))
	expect("") // 4 s without a renewal: a frozen replica knows no leader

	v.observe(leaderLease("a_1", renewed.Add(time.Second), 4)) // renewed
	expect("a_1")
	v.observe(leaderLease("b_2", renewed.Add(2*time.Second), 4)) // taken over
	expect("b_2")
	v.observe(leaderLease("", renewed.Add(3*time.Second), 4)) // released
	expect("")
	v.observe(leaderLease("b_2", renewed.Add(4*time.Second), 4))
	v.forget() // deleted
	expect("")
}

// TestSharderWritesFencedByLeader: with a leader known, the sharder's label
// changes are allowed only with the field manager of the replica that
// leads; without fencing, any of its replicas' are.
func TestSharderWritesFencedByLeader(t *testing.T) {
	move := labelRequest{ring: "etcd", op: admissionv1.Update, username: testSharder, oldShard: present("a"), newShard: present("b")}
	with := func(fm string) labelRequest { r := move; r.fieldManager = fm; return r }
	leads := func(holder string) func() (string, string) {
		return func() (string, string) {
			if holder == "" {
				return "", "Lease sharder-system/sharder has no holder"
			}
			return holder, ""
		}
	}
	for _, tc := range []struct {
		name    string
		sharder sharderOf
		req     labelRequest
		allowed bool
		message []string
	}{
		{name: "not fenced: any replica", sharder: sharderOf{identity: testSharder}, req: with("sharder/b_2"), allowed: true},
		{name: "not fenced: no field manager", sharder: sharderOf{identity: testSharder}, req: move, allowed: true},
		{name: "the leader", sharder: sharderOf{identity: testSharder, leader: leads("a_1")}, req: with(LeaderFieldManager("a_1")), allowed: true},
		{name: "a replica that does not lead", sharder: sharderOf{identity: testSharder, leader: leads("a_1")}, req: with(LeaderFieldManager("b_2")),
			message: []string{`"a_1"`, `"sharder/b_2"`, `ring "etcd"`}},
		{name: "no field manager", sharder: sharderOf{identity: testSharder, leader: leads("a_1")}, req: move,
			message: []string{`"a_1"`}},
		{name: "no leader known", sharder: sharderOf{identity: testSharder, leader: leads("")}, req: with(LeaderFieldManager("a_1")),
			message: []string{"no holder"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := admit(tc.req, testRing(), tc.sharder, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := reasonNotLeader
			if tc.allowed {
				want = reasonSharder
			}
			if v.allowed != tc.allowed || v.reason != want {
				t.Fatalf("allowed %v reason %q (%s), want allowed %v reason %q", v.allowed, v.reason, v.message, tc.allowed, want)
			}
			for _, m := range tc.message {
				if !strings.Contains(v.message, m) {
					t.Errorf("message %q does not contain %s", v.message, m)
				}
			}
		})
	}
}

// TestFencedConfigurationSendsSharderWrites: with fencing, no
// matchCondition skips the sharder's own requests.
func TestFencedConfigurationSendsSharderWrites(t *testing.T) {
	rings := []v1alpha1.ControllerRing{*testRing()}
	for _, fenced := range []bool{false, true} {
		cfg := buildConfiguration(rings, configParams{name: "sharder", identity: testSharder, fenced: fenced, caBundle: []byte("CA"), timeout: 5})
		for _, w := range cfg.Webhooks {
			skips := false
			for _, c := range w.MatchConditions {
				skips = skips || strings.Contains(c.Expression, testSharder)
			}
			if skips == fenced {
				t.Errorf("fenced %v: %s skips the sharder's requests: %v", fenced, w.Name, skips)
			}
		}
	}
}

func TestFieldManagerOf(t *testing.T) {
	for raw, want := range map[string]string{
		`{"kind":"PatchOptions","apiVersion":"meta.k8s.io/v1","fieldManager":"sharder/a_1"}`: "sharder/a_1",
		`{"kind":"UpdateOptions","apiVersion":"meta.k8s.io/v1"}`:                             "",
		``:    "",
		`{"x`: "",
	} {
		if got := fieldManagerOf([]byte(raw)); got != want {
			t.Errorf("fieldManagerOf(%s) = %q, want %q", raw, got, want)
		}
	}
}
