package webhook

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

func TestBuildConfiguration(t *testing.T) {
	fail := admissionregistrationv1.Fail
	rings := []v1alpha1.ControllerRing{{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: v1alpha1.ControllerRingSpec{
			Resources: []v1alpha1.RingResource{{Group: "", Resource: "configmaps",
				ControlledResources: []metav1.GroupResource{{Group: "", Resource: "secrets"}, {Group: "apps", Resource: "deployments"}}}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "web"}},
			Webhook:           &v1alpha1.RingWebhook{FailurePolicy: &fail},
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "etcd"},
		Spec: v1alpha1.ControllerRingSpec{
			Resources: []v1alpha1.RingResource{
				{Group: "etcd.example.dev", Resource: "etcdclusters", ControlledResources: []metav1.GroupResource{{Group: "apps", Resource: "statefulsets"}}},
				{Group: "etcd.example.dev", Resource: "etcdbackups", ControlledResources: []metav1.GroupResource{{Group: "apps", Resource: "statefulsets"}}},
			},
		},
	}}
	cfg := buildConfiguration(rings, configParams{
		name: "sharder", identity: testSharder, caBundle: []byte("CA"), timeout: 5,
		service: admissionregistrationv1.ServiceReference{Namespace: "sharder-system", Name: "sharder-webhook", Port: ptr.To[int32](443)},
	})

	if cfg.Name != "sharder" || cfg.Labels[labelManagedBy] != managedBy {
		t.Fatalf("metadata = %+v", cfg.ObjectMeta)
	}
	var names []string
	for _, w := range cfg.Webhooks {
		names = append(names, w.Name)
	}
	want := []string{"etcd.shard-label.sharder.dev", "etcd.drain-label.sharder.dev", "web.shard-label.sharder.dev", "web.drain-label.sharder.dev"}
	if !slices.Equal(names, want) {
		t.Fatalf("webhooks = %v, want %v (sorted by ring)", names, want)
	}

	etcd, web := cfg.Webhooks[0], cfg.Webhooks[2]
	wantRules := func(w admissionregistrationv1.ValidatingWebhook, want map[string][]string) {
		t.Helper()
		got := map[string][]string{}
		for _, r := range w.Rules {
			if !slices.Equal(r.Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}) {
				t.Errorf("%s: operations %v", w.Name, r.Operations)
			}
			got[r.APIGroups[0]] = r.Resources
		}
		if len(got) != len(want) {
			t.Fatalf("%s: rules %v, want %v", w.Name, got, want)
		}
		for g, rs := range want {
			if !slices.Equal(got[g], rs) {
				t.Errorf("%s: group %q resources %v, want %v", w.Name, g, got[g], rs)
			}
		}
	}
	// Each resource comes with its status subresource: for most built-in
	// kinds a status update keeps metadata changes.
	wantRules(etcd, map[string][]string{
		"apps":             {"statefulsets", "statefulsets/status"},
		"etcd.example.dev": {"etcdbackups", "etcdbackups/status", "etcdclusters", "etcdclusters/status"},
	})
	wantRules(web, map[string][]string{"": {"configmaps", "configmaps/status", "secrets", "secrets/status"}, "apps": {"deployments", "deployments/status"}})
	ns := buildConfiguration([]v1alpha1.ControllerRing{{
		ObjectMeta: metav1.ObjectMeta{Name: "ns"},
		Spec:       v1alpha1.ControllerRingSpec{Resources: []v1alpha1.RingResource{{Resource: "namespaces"}}},
	}}, configParams{name: "sharder", timeout: 5})
	wantRules(ns.Webhooks[0], map[string][]string{"": {"namespaces", "namespaces/finalize", "namespaces/status"}})

	if *etcd.FailurePolicy != admissionregistrationv1.Ignore || *web.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failure policies %s %s, want Ignore (default) and Fail", *etcd.FailurePolicy, *web.FailurePolicy)
	}
	if *etcd.SideEffects != admissionregistrationv1.SideEffectClassNone || *etcd.TimeoutSeconds != 5 {
		t.Errorf("sideEffects %s timeout %d", *etcd.SideEffects, *etcd.TimeoutSeconds)
	}
	if got := etcd.NamespaceSelector.MatchExpressions; len(got) != 1 || got[0].Values[0] != "kube-system" {
		t.Errorf("etcd namespaceSelector %v, want the default (not kube-system)", etcd.NamespaceSelector)
	}
	if web.NamespaceSelector.MatchLabels["team"] != "web" {
		t.Errorf("web namespaceSelector %v, want the ring's", web.NamespaceSelector)
	}
	if p := *etcd.ClientConfig.Service.Path; p != "/validate-labels/etcd/ignore" || string(etcd.ClientConfig.CABundle) != "CA" {
		t.Errorf("clientConfig %+v", etcd.ClientConfig)
	}
	if p := *web.ClientConfig.Service.Path; p != "/validate-labels/web/fail" {
		t.Errorf("web path %q", p)
	}

	shardHook, drainHook := cfg.Webhooks[0], cfg.Webhooks[1]
	if k := shardHook.ObjectSelector.MatchExpressions[0]; k.Key != "shard.sharder.dev/etcd" || k.Operator != metav1.LabelSelectorOpExists {
		t.Errorf("shard webhook objectSelector %v", shardHook.ObjectSelector)
	}
	if k := drainHook.ObjectSelector.MatchExpressions[0]; k.Key != "drain.sharder.dev/etcd" || k.Operator != metav1.LabelSelectorOpExists {
		t.Errorf("drain webhook objectSelector %v", drainHook.ObjectSelector)
	}
	exprs := func(w admissionregistrationv1.ValidatingWebhook) string {
		var s []string
		for _, c := range w.MatchConditions {
			s = append(s, c.Expression)
		}
		return strings.Join(s, "\n")
	}
	for _, w := range []admissionregistrationv1.ValidatingWebhook{shardHook, drainHook} {
		e := exprs(w)
		if !strings.Contains(e, `request.userInfo.username != "`+testSharder+`"`) ||
			!strings.Contains(e, `"shard.sharder.dev/etcd"`) || !strings.Contains(e, `"drain.sharder.dev/etcd"`) {
			t.Errorf("%s: matchConditions %s", w.Name, e)
		}
	}
	if len(drainHook.MatchConditions) != len(shardHook.MatchConditions)+1 {
		t.Errorf("the drain webhook must skip objects with the shard label (left to the shard webhook)")
	}

	url := buildConfiguration(rings[:1], configParams{name: "sharder", url: "https://127.0.0.1:9443/", timeout: 5})
	if u := url.Webhooks[0].ClientConfig.URL; u == nil || *u != "https://127.0.0.1:9443/validate-labels/web/fail" || url.Webhooks[0].ClientConfig.Service != nil {
		t.Errorf("URL mode clientConfig %+v", url.Webhooks[0].ClientConfig)
	}
	inject := buildConfiguration(rings[:1], configParams{name: "sharder", injectFrom: "sharder-system/sharder-webhook", timeout: 5})
	if inject.Annotations[annotationInjectCA] != "sharder-system/sharder-webhook" {
		t.Errorf("annotations %v", inject.Annotations)
	}
	if empty := buildConfiguration(nil, configParams{name: "sharder"}); len(empty.Webhooks) != 0 {
		t.Errorf("no ring: %d webhooks", len(empty.Webhooks))
	}
}

func TestOptionsDefaults(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "ops")
	o := Options{}
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if o.Namespace != "ops" || o.ServiceNamespace != "ops" || o.ConfigurationName != config.DefaultWebhookConfigurationName ||
		o.SecretName != config.DefaultWebhookSecretName || o.TimeoutSeconds != config.DefaultWebhookTimeoutSeconds || o.CertMode != config.CertModeSelfManaged || o.Clock == nil {
		t.Fatalf("defaults %+v", o)
	}
	if h := o.hosts(); !slices.Contains(h, "sharder-webhook.ops.svc") {
		t.Errorf("hosts %v", h)
	}
	u := Options{URL: "https://127.0.0.1:9443"}
	if err := u.setDefaults(); err != nil || !slices.Contains(u.hosts(), "127.0.0.1") {
		t.Errorf("URL host not in hosts: %v %v", u.hosts(), err)
	}
	for name, o := range map[string]Options{
		"timeout":        {TimeoutSeconds: 31},
		"mode":           {CertMode: "manual"},
		"url scheme":     {URL: "http://127.0.0.1"},
		"url query":      {URL: "https://127.0.0.1/?a=b"},
		"url path":       {URL: "https://127.0.0.1/x"},
		"service name":   {ServiceName: "Sharder.Webhook"},
		"inject":         {CAInjectFrom: "no-slash"},
		"cert timings":   {CertValidity: DefaultCARenewBefore},
		"service port":   {ServicePort: 70000},
		"renew too late": {CertRenewBefore: DefaultCertValidity},
	} {
		if err := o.setDefaults(); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}
