package owners_test

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/owners"
)

var (
	gkCluster     = schema.GroupKind{Group: "etcd.example.dev", Kind: "EtcdCluster"}
	gkStatefulSet = schema.GroupKind{Group: "apps", Kind: "StatefulSet"}
	gkPod         = schema.GroupKind{Kind: "Pod"}
	gkService     = schema.GroupKind{Kind: "Service"}
	gkDeployment  = schema.GroupKind{Group: "apps", Kind: "Deployment"}
	gkSecret      = schema.GroupKind{Kind: "Secret"}
)

func controllerRef(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: &yes}
}

func object(namespace, name string, uid types.UID, owners ...metav1.OwnerReference) *metav1.ObjectMeta {
	return &metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uid, OwnerReferences: owners}
}

// testResolver resolves for a ring whose main resource is EtcdCluster and
// whose controlled resources are StatefulSets, Pods and Services.
func testResolver(objects map[owners.ObjectRef]metav1.Object) owners.Resolver {
	return owners.Resolver{
		IsMain: func(gk schema.GroupKind) bool { return gk == gkCluster },
		IsControlled: func(gk schema.GroupKind) bool {
			return gk == gkStatefulSet || gk == gkPod || gk == gkService
		},
		Lookup: func(gk schema.GroupKind, namespace, name string) (metav1.Object, bool) {
			o, ok := objects[owners.ObjectRef{GroupKind: gk, Namespace: namespace, Name: name}]
			return o, ok
		},
	}
}

func TestResolverKey(t *testing.T) {
	notController := metav1.OwnerReference{APIVersion: "etcd.example.dev/v1alpha1", Kind: "EtcdCluster", Name: "main", UID: "c1"}
	objects := map[owners.ObjectRef]metav1.Object{
		{GroupKind: gkCluster, Namespace: "prod", Name: "main"}:        object("prod", "main", "c1"),
		{GroupKind: gkStatefulSet, Namespace: "prod", Name: "main"}:    object("prod", "main", "s1", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "main", "c1")),
		{GroupKind: gkStatefulSet, Namespace: "prod", Name: "orphan"}:  object("prod", "orphan", "s2"),
		{GroupKind: gkStatefulSet, Namespace: "prod", Name: "loop-a"}:  object("prod", "loop-a", "s3", controllerRef("apps/v1", "StatefulSet", "loop-b", "")),
		{GroupKind: gkStatefulSet, Namespace: "prod", Name: "loop-b"}:  object("prod", "loop-b", "s4", controllerRef("apps/v1", "StatefulSet", "loop-a", "")),
		{GroupKind: gkStatefulSet, Namespace: "prod", Name: "self"}:    object("prod", "self", "s5", controllerRef("apps/v1", "StatefulSet", "self", "s5")),
		{GroupKind: gkStatefulSet, Namespace: "prod", Name: "foreign"}: object("prod", "foreign", "s6", controllerRef("apps/v1", "Deployment", "web", "d1")),
	}
	r := testResolver(objects)
	for _, tc := range []struct {
		name    string
		gk      schema.GroupKind
		obj     metav1.Object
		want    string
		wantErr error
	}{
		{name: "main object", gk: gkCluster, obj: object("prod", "main", "c1"), want: "etcd.example.dev/EtcdCluster/prod/main"},
		{name: "main object not in cache yet", gk: gkCluster, obj: object("dev", "new", ""), want: "etcd.example.dev/EtcdCluster/dev/new"},
		{name: "one level", gk: gkService, obj: object("prod", "main-client", "v1", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "main", "c1")),
			want: "etcd.example.dev/EtcdCluster/prod/main"},
		{name: "two levels", gk: gkPod, obj: object("prod", "main-0", "p1", controllerRef("apps/v1", "StatefulSet", "main", "s1")),
			want: "etcd.example.dev/EtcdCluster/prod/main"},
		{name: "owner reference without UID", gk: gkService, obj: object("prod", "x", "", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "main", "")),
			want: "etcd.example.dev/EtcdCluster/prod/main"},
		{name: "no controller", gk: gkService, obj: object("prod", "x", "", notController), wantErr: owners.ErrNoController},
		{name: "no owner at all", gk: gkPod, obj: object("prod", "x", ""), wantErr: owners.ErrNoController},
		{name: "chain ends without controller", gk: gkPod, obj: object("prod", "x", "", controllerRef("apps/v1", "StatefulSet", "orphan", "s2")), wantErr: owners.ErrNoController},
		{name: "owner of another kind", gk: gkPod, obj: object("prod", "x", "", controllerRef("batch/v1", "Job", "j", "")), wantErr: owners.ErrOwnerNotInRing},
		{name: "same kind, other group", gk: gkPod, obj: object("prod", "x", "", controllerRef("v1", "StatefulSet", "main", "")), wantErr: owners.ErrOwnerNotInRing},
		{name: "owner further up not in ring", gk: gkPod, obj: object("prod", "x", "", controllerRef("apps/v1", "StatefulSet", "foreign", "s6")), wantErr: owners.ErrOwnerNotInRing},
		{name: "malformed apiVersion", gk: gkPod, obj: object("prod", "x", "", controllerRef("a/b/c", "StatefulSet", "main", "")), wantErr: owners.ErrOwnerNotInRing},
		{name: "owner unknown", gk: gkService, obj: object("prod", "x", "", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "gone", "")), wantErr: owners.ErrOwnerUnknown},
		{name: "owner in another namespace is not found", gk: gkService, obj: object("dev", "x", "", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "main", "c1")), wantErr: owners.ErrOwnerUnknown},
		{name: "owner recreated with another UID", gk: gkService, obj: object("prod", "x", "", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "main", "old")), wantErr: owners.ErrOwnerUnknown},
		{name: "owner reference with empty name", gk: gkService, obj: object("prod", "x", "", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "", "")), wantErr: owners.ErrOwnerUnknown},
		{name: "cycle", gk: gkPod, obj: object("prod", "x", "", controllerRef("apps/v1", "StatefulSet", "loop-a", "s3")), wantErr: owners.ErrOwnershipCycle},
		{name: "own controller", gk: gkStatefulSet, obj: objects[owners.ObjectRef{GroupKind: gkStatefulSet, Namespace: "prod", Name: "self"}], wantErr: owners.ErrOwnershipCycle},
		{name: "not a ring resource", gk: gkSecret, obj: object("prod", "x", ""), wantErr: owners.ErrNotRingResource},
		{name: "nil object", gk: gkPod, obj: nil, wantErr: owners.ErrInvalidObject},
		{name: "typed nil object", gk: gkPod, obj: (*metav1.ObjectMeta)(nil), wantErr: owners.ErrInvalidObject},
		{name: "no name", gk: gkCluster, obj: object("prod", "", ""), wantErr: owners.ErrInvalidObject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Key(tc.gk, tc.obj)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Key() error = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("Key() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestResolverRoot(t *testing.T) {
	r := testResolver(map[owners.ObjectRef]metav1.Object{
		{GroupKind: gkCluster, Namespace: "prod", Name: "main"}: object("prod", "main", "c1"),
	})
	got, err := r.Root(gkService, object("prod", "x", "", controllerRef("etcd.example.dev/v1", "EtcdCluster", "main", "c1")))
	if err != nil {
		t.Fatal(err)
	}
	want := owners.ObjectRef{GroupKind: gkCluster, Namespace: "prod", Name: "main"}
	if got != want {
		t.Fatalf("Root() = %v, want %v", got, want)
	}
	if got.String() != "EtcdCluster.etcd.example.dev prod/main" {
		t.Fatalf("String() = %q", got.String())
	}
}

// A kind that is main and controlled at once is a main object: its own key.
func TestResolverMainWins(t *testing.T) {
	r := owners.Resolver{
		IsMain:       func(gk schema.GroupKind) bool { return gk == gkDeployment },
		IsControlled: func(gk schema.GroupKind) bool { return gk == gkDeployment },
	}
	got, err := r.Key(gkDeployment, object("ns", "web", "", controllerRef("apps/v1", "Deployment", "other", "")))
	if err != nil || got != "apps/Deployment/ns/web" {
		t.Fatalf("Key() = %q, %v", got, err)
	}
}

// A zero Resolver answers with errors, never panics.
func TestZeroResolver(t *testing.T) {
	if _, err := (owners.Resolver{}).Key(gkPod, object("ns", "x", "")); !errors.Is(err, owners.ErrNotRingResource) {
		t.Fatalf("error = %v, want ErrNotRingResource", err)
	}
	r := owners.Resolver{IsControlled: func(schema.GroupKind) bool { return true }}
	if _, err := r.Key(gkPod, object("ns", "x", "", controllerRef("apps/v1", "StatefulSet", "s", ""))); !errors.Is(err, owners.ErrOwnerUnknown) {
		t.Fatalf("error = %v, want ErrOwnerUnknown", err)
	}
}

// A Lookup that invents a new owner at every step ends at MaxOwnerDepth.
func TestResolverDepthLimit(t *testing.T) {
	n := 0
	r := owners.Resolver{
		IsMain:       func(gk schema.GroupKind) bool { return gk == gkCluster },
		IsControlled: func(gk schema.GroupKind) bool { return gk == gkStatefulSet },
		Lookup: func(gk schema.GroupKind, namespace, name string) (metav1.Object, bool) {
			n++
			return object(namespace, name, "", controllerRef("apps/v1", "StatefulSet", name+"x", "")), true
		},
	}
	_, err := r.Key(gkStatefulSet, object("ns", "s", "", controllerRef("apps/v1", "StatefulSet", "sx", "")))
	if !errors.Is(err, owners.ErrOwnershipCycle) || n != owners.MaxOwnerDepth {
		t.Fatalf("error = %v after %d lookups, want ErrOwnershipCycle after %d", err, n, owners.MaxOwnerDepth)
	}
}

func BenchmarkResolverKey(b *testing.B) {
	pod := object("prod", "main-0", "p1", controllerRef("apps/v1", "StatefulSet", "main", "s1"))
	r := testResolver(map[owners.ObjectRef]metav1.Object{
		{GroupKind: gkCluster, Namespace: "prod", Name: "main"}:     object("prod", "main", "c1"),
		{GroupKind: gkStatefulSet, Namespace: "prod", Name: "main"}: object("prod", "main", "s1", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "main", "c1")),
	})
	for b.Loop() {
		if _, err := r.Key(gkPod, pod); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzResolverKey resolves keys of objects whose ownerReferences come from
// arbitrary strings, through a resolver whose objects reference each other,
// and checks that nothing panics and that results are keys of main objects
// or errors.
func FuzzResolverKey(f *testing.F) {
	f.Add("prod", "x", "apps/v1", "StatefulSet", "main", true)
	f.Add("prod", "x", "etcd.example.dev/v1alpha1", "EtcdCluster", "main", true)
	f.Add("", "", "", "", "", false)
	f.Add("prod", "x", "apps/v1", "StatefulSet", "loop-a", true)
	f.Add("prod", "x", "/", "StatefulSet", "x", true)
	f.Add("prod", "x", "a/b/c", "", "x", true)
	f.Fuzz(func(t *testing.T, namespace, name, apiVersion, kind, ownerName string, controller bool) {
		objects := map[owners.ObjectRef]metav1.Object{
			{GroupKind: gkCluster, Namespace: "prod", Name: "main"}:       object("prod", "main", "c1"),
			{GroupKind: gkStatefulSet, Namespace: "prod", Name: "main"}:   object("prod", "main", "s1", controllerRef("etcd.example.dev/v1alpha1", "EtcdCluster", "main", "c1")),
			{GroupKind: gkStatefulSet, Namespace: "prod", Name: "loop-a"}: object("prod", "loop-a", "", controllerRef("apps/v1", "StatefulSet", "loop-b", "")),
			{GroupKind: gkStatefulSet, Namespace: "prod", Name: "loop-b"}: object("prod", "loop-b", "", controllerRef("apps/v1", "StatefulSet", "loop-a", "")),
		}
		// The object under test may also be referenced from the cache.
		objects[owners.ObjectRef{GroupKind: gkStatefulSet, Namespace: namespace, Name: name}] = object(namespace, name, "", controllerRef(apiVersion, kind, ownerName, ""))
		r := testResolver(objects)
		ref := metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: ownerName, Controller: &controller}
		for _, gk := range []schema.GroupKind{gkPod, gkStatefulSet, gkCluster, {Group: apiVersion, Kind: kind}} {
			key, err := r.Key(gk, object(namespace, name, "", ref))
			if err != nil {
				if key != "" {
					t.Fatalf("Key() = %q with error %v", key, err)
				}
				continue
			}
			if !strings.HasPrefix(key, "etcd.example.dev/EtcdCluster/") {
				t.Fatalf("Key() = %q: not the key of a main object", key)
			}
		}
	})
}
