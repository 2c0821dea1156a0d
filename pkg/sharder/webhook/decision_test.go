package webhook

import (
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

const (
	testSharder  = "system:serviceaccount:sharder-system:sharder"
	testInstance = "system:serviceaccount:operators:etcd-operator"
)

func testRing() *v1alpha1.ControllerRing {
	return &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd"},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace:          "operators",
			Resources:               []v1alpha1.RingResource{{Group: "etcd.example.dev", Resource: "etcdclusters"}},
			InstanceServiceAccounts: []v1alpha1.ServiceAccountReference{{Namespace: "operators", Name: "etcd-operator"}},
		},
	}
}

func present(v string) labelState { return labelState{present: true, value: v} }

func TestDecide(t *testing.T) {
	choose := func(instance, why string) choice {
		return func() (string, string, error) { return instance, why, nil }
	}
	noChoice := func() (string, string, error) {
		t.Error("choice asked for a request that is not a labelled creation")
		return "", "", nil
	}
	// podOf answers like the handler: the Lease's Pod owner, else a pod named
	// like the instance.
	podOf := func(ownerNS, owner string) instancePod {
		return func(instance string) (string, string, error) {
			if owner != "" {
				return ownerNS, owner, nil
			}
			return "", instance, nil
		}
	}
	noPod := func(string) (string, string, error) {
		t.Error("instance pod asked for a request that is not a pod-bound acknowledgement")
		return "", "", nil
	}
	for _, tc := range []struct {
		name    string
		req     labelRequest
		choose  choice
		podOf   instancePod
		allowed bool
		reason  string
		// message must contain these
		message []string
	}{{
		name:    "labels unchanged",
		req:     labelRequest{op: admissionv1.Update, username: "alice", oldShard: present("a"), newShard: present("a")},
		allowed: true, reason: reasonUnchanged,
	}, {
		name:    "sharder relabels",
		req:     labelRequest{op: admissionv1.Update, username: testSharder, oldShard: present("a"), newShard: present("b")},
		allowed: true, reason: reasonSharder,
	}, {
		name:    "sharder sets drain label",
		req:     labelRequest{op: admissionv1.Update, username: testSharder, oldShard: present("a"), newShard: present("a"), newDrain: present("true")},
		allowed: true, reason: reasonSharder,
	}, {
		name:   "user changes the shard label",
		req:    labelRequest{op: admissionv1.Update, username: "alice", oldShard: present("a"), newShard: present("b")},
		reason: reasonShardLabel, message: []string{`"shard.sharder.dev/etcd"`, `ring "etcd"`, "leave it as it is"},
	}, {
		name:   "user removes the shard label",
		req:    labelRequest{op: admissionv1.Update, username: "alice", oldShard: present("a")},
		reason: reasonShardLabel, message: []string{`"shard.sharder.dev/etcd"`, `ring "etcd"`},
	}, {
		name:   "user empties the shard label",
		req:    labelRequest{op: admissionv1.Update, username: "alice", oldShard: present("a"), newShard: present("")},
		reason: reasonShardLabel,
	}, {
		name:   "user adds a drain label",
		req:    labelRequest{op: admissionv1.Update, username: "alice", oldShard: present("a"), newShard: present("a"), newDrain: present("true")},
		reason: reasonDrainLabel, message: []string{`"drain.sharder.dev/etcd"`, `ring "etcd"`, "acknowledges a drain by removing", "the instance the drain label names"},
	}, {
		name:   "user removes only the drain label",
		req:    labelRequest{op: admissionv1.Update, username: "alice", oldShard: present("a"), newShard: present("a"), oldDrain: present("true")},
		reason: reasonDrainLabel,
	}, {
		name:    "instance acknowledges a drain",
		req:     labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), oldDrain: present("true")},
		allowed: true, reason: reasonAcknowledgement,
	}, {
		name:   "user acknowledges a drain",
		req:    labelRequest{op: admissionv1.Update, username: "alice", oldShard: present("a"), oldDrain: present("true")},
		reason: reasonNotInstance, message: []string{"spec.instanceServiceAccounts", `"alice"`, `ring "etcd"`},
	}, {
		name:    "the instance's own pod acknowledges a drain",
		req:     labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"a"}, oldShard: present("a"), oldDrain: present("true")},
		podOf:   podOf("", ""),
		allowed: true, reason: reasonAcknowledgement,
	}, {
		name:   "another instance's pod acknowledges a drain",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"b"}, oldShard: present("a"), oldDrain: present("true")},
		podOf:  podOf("", ""),
		reason: reasonOtherInstance, message: []string{`instance "a"`, "pod a;", "pod operators/b", "leave both labels as they are"},
	}, {
		name:    "the pod its Lease names as owner acknowledges a drain",
		req:     labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"etcd-0"}, oldShard: present("a"), oldDrain: present("true")},
		podOf:   podOf("operators", "etcd-0"),
		allowed: true, reason: reasonAcknowledgement,
	}, {
		name:   "a pod named like the instance is not the pod its Lease names",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"a"}, oldShard: present("a"), oldDrain: present("true")},
		podOf:  podOf("operators", "etcd-0"),
		reason: reasonOtherInstance, message: []string{"pod operators/etcd-0 (the owner of its Lease)"},
	}, {
		name:   "the Lease's pod in another namespace",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"etcd-0"}, oldShard: present("a"), oldDrain: present("true")},
		podOf:  podOf("elsewhere", "etcd-0"),
		reason: reasonOtherInstance,
	}, {
		name:   "a credential naming two pods",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"a", "b"}, oldShard: present("a"), oldDrain: present("true")},
		podOf:  podOf("", ""),
		reason: reasonOtherInstance,
	}, {
		name:    "a pod-bound acknowledgement of a lone drain label, which no instance holds",
		req:     labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"b"}, oldDrain: present("true")},
		allowed: true, reason: reasonAcknowledgement,
	}, {
		name:   "a pod-bound credential of another service account",
		req:    labelRequest{op: admissionv1.Update, username: "system:serviceaccount:operators:other", pods: []string{"a"}, oldShard: present("a"), oldDrain: present("true")},
		reason: reasonNotInstance,
	}, {
		name:   "instance removes the shard label without a drain",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a")},
		reason: reasonShardLabel,
	}, {
		name:   "instance keeps the shard label while removing the drain label",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present("a"), oldDrain: present("true")},
		reason: reasonDrainLabel,
	}, {
		name:    "instance hands the object over to the drain's target",
		req:     labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present("b"), oldDrain: present("b")},
		allowed: true, reason: reasonAcknowledgement,
	}, {
		name:    "the instance's own pod hands the object over",
		req:     labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"a"}, oldShard: present("a"), newShard: present("b"), oldDrain: present("b")},
		podOf:   podOf("", ""),
		allowed: true, reason: reasonAcknowledgement,
	}, {
		name:   "the target's pod hands the object over to itself",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, pods: []string{"b"}, oldShard: present("a"), newShard: present("b"), oldDrain: present("b")},
		podOf:  podOf("", ""),
		reason: reasonOtherInstance, message: []string{`instance "a"`, "leave both labels as they are"},
	}, {
		name:   "user hands the object over",
		req:    labelRequest{op: admissionv1.Update, username: "alice", oldShard: present("a"), newShard: present("b"), oldDrain: present("b")},
		reason: reasonNotInstance, message: []string{"spec.instanceServiceAccounts", `"alice"`},
	}, {
		name:   "instance hands the object over to another instance than the drain names",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present("c"), oldDrain: present("b")},
		reason: reasonDrainLabel,
	}, {
		name:   "instance sets the drain's target but keeps the drain label",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present("b"), oldDrain: present("b"), newDrain: present("b")},
		reason: reasonShardLabel,
	}, {
		name:   "instance sets the shard label to the drain's target of another value",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present("b"), oldDrain: present("b"), newDrain: present("c")},
		reason: reasonDrainLabel,
	}, {
		name:   "instance hands over a drain that names no target",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present("true"), oldDrain: present("true")},
		reason: reasonDrainLabel,
	}, {
		name:   "instance hands over to a drain value that is not an instance ID",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present(""), oldDrain: present("")},
		reason: reasonDrainLabel,
	}, {
		name:   "instance hands a released object over (no instance holds it)",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, newShard: present("b"), oldDrain: present("b")},
		reason: reasonDrainLabel,
	}, {
		name:   "instance adds a drain label naming another instance",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present("a"), newDrain: present("b")},
		reason: reasonDrainLabel,
	}, {
		name:   "instance sets the shard label to another instance without a drain",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, oldShard: present("a"), newShard: present("b")},
		reason: reasonShardLabel,
	}, {
		name:    "create with the chosen instance",
		req:     labelRequest{op: admissionv1.Create, username: testInstance, newShard: present("a")},
		choose:  choose("a", ""),
		allowed: true, reason: reasonAssignment,
	}, {
		name:   "create with the chosen instance by any user",
		req:    labelRequest{op: admissionv1.Create, username: "alice", newShard: present("a")},
		choose: choose("a", ""), allowed: true, reason: reasonAssignment,
	}, {
		name:   "create with another instance",
		req:    labelRequest{op: admissionv1.Create, username: testInstance, newShard: present("b")},
		choose: choose("a", ""),
		reason: reasonWrongInstance, message: []string{`instance "a", not "b"`, "shard.sharder.dev/etcd=a"},
	}, {
		name:   "create with no instance to choose",
		req:    labelRequest{op: admissionv1.Create, username: testInstance, newShard: present("a")},
		choose: choose("", "the ring has no ready instance"),
		reason: reasonNoChoice, message: []string{"no ready instance", "without the label"},
	}, {
		name:   "create with a drain label",
		req:    labelRequest{op: admissionv1.Create, username: testInstance, newShard: present("a"), newDrain: present("true")},
		reason: reasonDrainLabel,
	}, {
		name:   "create with only a drain label",
		req:    labelRequest{op: admissionv1.Create, username: "alice", newDrain: present("true")},
		reason: reasonDrainLabel,
	}, {
		name:   "update adding the owner's label to an existing child",
		req:    labelRequest{op: admissionv1.Update, username: testInstance, newShard: present("a")},
		reason: reasonShardLabel,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.ring = "etcd"
			c := tc.choose
			if c == nil {
				c = noChoice
			}
			p := tc.podOf
			if p == nil {
				p = noPod
			}
			v, err := admit(tc.req, testRing(), sharderOf{identity: testSharder}, c, p)
			if err != nil {
				t.Fatal(err)
			}
			if v.allowed != tc.allowed || v.reason != tc.reason {
				t.Fatalf("decide = allowed %v reason %q (%s), want allowed %v reason %q", v.allowed, v.reason, v.message, tc.allowed, tc.reason)
			}
			if !v.allowed && v.message == "" {
				t.Fatal("denial without a message")
			}
			for _, m := range tc.message {
				if !strings.Contains(v.message, m) {
					t.Errorf("message %q does not contain %q", v.message, m)
				}
			}
		})
	}
}

func TestDecideReturnsChoiceFault(t *testing.T) {
	boom := errors.New("leases not readable")
	_, err := admit(labelRequest{ring: "etcd", op: admissionv1.Create, username: "x", newShard: present("a")}, testRing(), sharderOf{identity: testSharder},
		func() (string, string, error) { return "", "", boom }, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the choice's error", err)
	}
	_, err = admit(labelRequest{ring: "etcd", op: admissionv1.Update, username: testInstance, pods: []string{"a"},
		oldShard: present("a"), oldDrain: present("true")}, testRing(), sharderOf{identity: testSharder}, nil,
		func(string) (string, string, error) { return "", "", boom })
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the instance pod lookup's error", err)
	}
}

func TestRingFromPath(t *testing.T) {
	for _, tc := range []struct {
		path   string
		ring   string
		policy admissionregistrationv1.FailurePolicyType
		ok     bool
	}{
		{ringPath("etcd", admissionregistrationv1.Fail), "etcd", admissionregistrationv1.Fail, true},
		{ringPath("etcd", admissionregistrationv1.Ignore), "etcd", admissionregistrationv1.Ignore, true},
		{PathPrefix + "etcd", "etcd", admissionregistrationv1.Ignore, true},
		{PathPrefix, "", "", false},
		{"/other/etcd", "", "", false},
	} {
		ring, policy, ok := ringFromPath(tc.path)
		if ring != tc.ring || policy != tc.policy || ok != tc.ok {
			t.Errorf("ringFromPath(%q) = %q %q %v, want %q %q %v", tc.path, ring, policy, ok, tc.ring, tc.policy, tc.ok)
		}
	}
}

func TestDecodeMetadata(t *testing.T) {
	m, err := decodeMetadata([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"x":"y"}},"data":{"big":"...."}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "a" || m.Labels["x"] != "y" || m.Kind != "ConfigMap" {
		t.Fatalf("decoded %+v", m)
	}
	for _, bad := range []string{"", "{", `{"metadata":"x"}`} {
		if _, err := decodeMetadata([]byte(bad)); err == nil {
			t.Errorf("decodeMetadata(%q): want an error", bad)
		}
	}
}
