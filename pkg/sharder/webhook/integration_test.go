package webhook_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	sharderdrain "github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook/internal/pki"
)

// expectDenied asserts that err is the webhook's denial carrying every part.
func expectDenied(g Gomega, err error, parts ...string) {
	g.Expect(err).To(HaveOccurred(), "the write was allowed")
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "not a denial: %v", err)
	g.Expect(err.Error()).To(ContainSubstring("denied the request"))
	for _, p := range parts {
		g.Expect(err.Error()).To(ContainSubstring(p))
	}
}

func labelled(ns, name string, labels map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Data: map[string]string{"k": "v"}}
}

// relabel reads obj with c, applies change to its labels and updates it.
func relabel(c client.Client, obj client.Object, change func(map[string]string), opts ...client.UpdateOption) error {
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
		return err
	}
	l := obj.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	change(l)
	obj.SetLabels(l)
	return c.Update(context.Background(), obj, opts...)
}

func TestLabelsProtected(t *testing.T) {
	ctx := context.Background()
	ns := env().Namespace(t)
	r := createRing(t, ns)
	startSharder(t, webhook.Options{})
	waitProtected(t, r.Name, ns)

	shard, drain := v1alpha1.ShardLabel(r.Name), v1alpha1.DrainLabel(r.Name)
	sh, alice, inst := clientAs(t, sharderUser), clientAs(t, userAlice), clientAs(t, instanceUser)

	t.Run("a user's edit of either label is denied with the label, the ring and what to do", func(t *testing.T) {
		g := NewWithT(t)
		cm := labelled(ns, "user-edit", map[string]string{shard: "inst-a"})
		g.Expect(sh.Create(ctx, cm)).To(Succeed())

		err := relabel(alice, cm, func(l map[string]string) { l[shard] = "inst-b" })
		expectDenied(g, err, `label "`+shard+`"`, `ring "`+r.Name+`"`, "leave it as it is")
		err = relabel(alice, cm, func(l map[string]string) { delete(l, shard) })
		expectDenied(g, err, shard)
		err = alice.Patch(ctx, labelled(ns, cm.Name, nil), client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"`+shard+`":"inst-c"}}}`)))
		expectDenied(g, err, shard)
		err = relabel(alice, cm, func(l map[string]string) { l[drain] = "true" })
		expectDenied(g, err, `label "`+drain+`"`, `ring "`+r.Name+`"`)

		lone := labelled(ns, "lone-drain", nil)
		g.Expect(alice.Create(ctx, lone)).To(Succeed())
		err = relabel(alice, lone, func(l map[string]string) { l[drain] = "true" })
		expectDenied(g, err, drain)
		expectDenied(g, alice.Create(ctx, labelled(ns, "created-with-drain", map[string]string{drain: "true"})), drain)

		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		g.Expect(cm.Labels).To(Equal(map[string]string{shard: "inst-a"}), "a denied write changed the object")
	})

	t.Run("dry-run requests are decided the same way", func(t *testing.T) {
		g := NewWithT(t)
		cm := labelled(ns, "dry-run", map[string]string{shard: "inst-a"})
		g.Expect(sh.Create(ctx, cm)).To(Succeed())
		expectDenied(g, relabel(alice, cm, func(l map[string]string) { l[shard] = "inst-b" }, client.DryRunAll), shard)
		g.Expect(relabel(alice, cm, func(l map[string]string) { l["team"] = "a" }, client.DryRunAll)).To(Succeed())
	})

	t.Run("other changes to labelled objects are allowed", func(t *testing.T) {
		g := NewWithT(t)
		cm := labelled(ns, "other-changes", map[string]string{shard: "inst-a", drain: "true"})
		g.Expect(sh.Create(ctx, cm)).To(Succeed())
		g.Expect(relabel(alice, cm, func(l map[string]string) { l["team"] = "a" })).To(Succeed())
		cm.Data = map[string]string{"k": "changed"}
		g.Expect(alice.Update(ctx, cm)).To(Succeed())
	})

	t.Run("the sharder changes both labels", func(t *testing.T) {
		g := NewWithT(t)
		cm := labelled(ns, "sharder-moves", map[string]string{shard: "inst-a"})
		g.Expect(sh.Create(ctx, cm)).To(Succeed())
		g.Expect(relabel(sh, cm, func(l map[string]string) { l[drain] = "true" })).To(Succeed())
		g.Expect(relabel(sh, cm, func(l map[string]string) { delete(l, drain); delete(l, shard) })).To(Succeed())
		g.Expect(relabel(sh, cm, func(l map[string]string) { l[shard] = "inst-b" })).To(Succeed())
	})

	t.Run("an instance acknowledges a drain; a user may not", func(t *testing.T) {
		g := NewWithT(t)
		cm := labelled(ns, "drained", map[string]string{shard: "inst-a", drain: "true"})
		g.Expect(sh.Create(ctx, cm)).To(Succeed())
		ack := func(l map[string]string) { delete(l, shard); delete(l, drain) }

		expectDenied(g, relabel(alice, cm, ack), "acknowledges a drain", "spec.instanceServiceAccounts", userAlice)
		g.Expect(relabel(inst, cm, ack)).To(Succeed())
		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		g.Expect(cm.Labels).NotTo(HaveKey(shard))
		g.Expect(cm.Labels).NotTo(HaveKey(drain))

		// Without a drain request, an instance may not drop its object.
		owned := labelled(ns, "not-drained", map[string]string{shard: "inst-a"})
		g.Expect(sh.Create(ctx, owned)).To(Succeed())
		expectDenied(g, relabel(inst, owned, ack), shard)
	})

	t.Run("an instance hands a drained object over to the drain's target, and only so", func(t *testing.T) {
		g := NewWithT(t)
		cm := labelled(ns, "handed-over", map[string]string{shard: "inst-a", drain: "inst-b"})
		g.Expect(sh.Create(ctx, cm)).To(Succeed())

		expectDenied(g, relabel(alice, cm, func(l map[string]string) { l[shard] = "inst-b"; delete(l, drain) }),
			"acknowledges a drain", "spec.instanceServiceAccounts")
		expectDenied(g, relabel(inst, cm, func(l map[string]string) { l[shard] = "inst-c"; delete(l, drain) }), drain)
		expectDenied(g, relabel(inst, cm, func(l map[string]string) { l[shard] = "inst-b" }), shard)
		expectDenied(g, relabel(inst, cm, func(l map[string]string) { l[drain] = "inst-c" }), drain)

		// The instance library's acknowledgement, as sent.
		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		g.Expect(sharderdrain.Acknowledge(ctx, inst, cm, r.Name)).To(Succeed())
		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(shard, "inst-b"))
		g.Expect(cm.Labels).NotTo(HaveKey(drain))

		// Handing over a drain that names no target is not an acknowledgement.
		legacy := labelled(ns, "legacy-drain", map[string]string{shard: "inst-a", drain: sharderdrain.NoTarget})
		g.Expect(sh.Create(ctx, legacy)).To(Succeed())
		expectDenied(g, relabel(inst, legacy, func(l map[string]string) { l[shard] = sharderdrain.NoTarget; delete(l, drain) }), drain)
		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(legacy), legacy)).To(Succeed())
		g.Expect(sharderdrain.Acknowledge(ctx, inst, legacy, r.Name)).To(Succeed())
		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(legacy), legacy)).To(Succeed())
		g.Expect(legacy.Labels).NotTo(HaveKey(shard))
		g.Expect(legacy.Labels).NotTo(HaveKey(drain))
	})

	t.Run("a child created with its owner's label is allowed, with another label denied", func(t *testing.T) {
		g := NewWithT(t)
		owner := labelled(ns, "owner", map[string]string{shard: "inst-a"})
		g.Expect(sh.Create(ctx, owner)).To(Succeed())
		child := func(name, instance string) *corev1.Secret {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}}}
			if instance != "" {
				s.Labels = map[string]string{shard: instance}
			}
			return s
		}
		g.Expect(inst.Create(ctx, child("child-ok", "inst-a"))).To(Succeed())
		expectDenied(g, inst.Create(ctx, child("child-wrong", "inst-b")), `instance "inst-a", not "inst-b"`, shard)
		g.Expect(inst.Create(ctx, child("child-unlabelled", ""))).To(Succeed())

		orphan := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: ns, Labels: map[string]string{shard: "inst-a"}}}
		expectDenied(g, inst.Create(ctx, orphan), "no controller")

		unassigned := labelled(ns, "unassigned-owner", nil)
		g.Expect(sh.Create(ctx, unassigned)).To(Succeed())
		s := child("child-of-unassigned", "inst-a")
		s.OwnerReferences[0].Name, s.OwnerReferences[0].UID = unassigned.Name, unassigned.UID
		expectDenied(g, inst.Create(ctx, s), "not assigned to an instance yet")
	})

	t.Run("a main object created with a ready instance is allowed, the sharder's choice or not", func(t *testing.T) {
		g := NewWithT(t)
		now := time.Now()
		// Two ready instances and one that released its Lease: only the
		// ready ones count. (A Lease counts as renewed when a replica first
		// sees it, whatever time is written on it: no clock but the
		// replica's decides.)
		for _, name := range []string{"inst-a", "inst-c"} {
			createLease(t, sh, ns, r.Name, name, now, time.Hour)
		}
		createLease(t, sh, ns, r.Name, "inst-b", now, time.Hour)
		released := &coordinationv1.Lease{}
		g.Expect(sh.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inst-b"}, released)).To(Succeed())
		released.Spec.HolderIdentity = ptr.To("")
		g.Expect(sh.Update(ctx, released)).To(Succeed())

		want, err := ring.New("", []ring.Member{{ID: "inst-a", VirtualNodes: v1alpha1.DefaultVirtualNodes}, {ID: "inst-c", VirtualNodes: v1alpha1.DefaultVirtualNodes}})
		g.Expect(err).NotTo(HaveOccurred())
		for i := range 6 {
			name := "chosen-" + strconv.Itoa(i)
			chosen, err := want.Lookup(ring.ObjectKey("", "ConfigMap", ns, name))
			g.Expect(err).NotTo(HaveOccurred())
			other := map[string]string{"inst-a": "inst-c", "inst-c": "inst-a"}[chosen]
			// The Lease cache may lag the Leases just created: retry until
			// the choice is made over them.
			g.Eventually(func() error {
				return inst.Create(ctx, labelled(ns, name, map[string]string{shard: chosen}), client.DryRunAll)
			}).Should(Succeed())
			// Another ready instance passes too: during a change of the
			// ready instances, the assigning webhook and this one (or two
			// replicas) may pick differently, and the create must not fail;
			// the sharder moves the object to its choice.
			g.Expect(inst.Create(ctx, labelled(ns, name, map[string]string{shard: other}), client.DryRunAll)).To(Succeed())
			// Denied on every attempt; until the ring without inst-b is
			// published, with the message of a pick that is no longer ready.
			g.Eventually(func() string {
				err := inst.Create(ctx, labelled(ns, name, map[string]string{shard: "inst-b"}))
				expectDenied(g, err)
				return err.Error()
			}).Should(ContainSubstring(`not "inst-b"`))
			expectDenied(g, inst.Create(ctx, labelled(ns, name, map[string]string{shard: "inst-unknown"})), `not "inst-unknown"`)
			g.Expect(inst.Create(ctx, labelled(ns, name, map[string]string{shard: chosen}))).To(Succeed())
		}
	})

	t.Run("objects without the ring's labels never reach the webhook", func(t *testing.T) {
		g := NewWithT(t)
		before := webhookCalls(r.Name)

		plain := labelled(ns, "plain", map[string]string{"team": "a"})
		g.Expect(alice.Create(ctx, plain)).To(Succeed())
		for i := range 5 {
			plain.Data = map[string]string{"k": strconv.Itoa(i)}
			g.Expect(alice.Update(ctx, plain)).To(Succeed())
		}
		g.Expect(relabel(alice, plain, func(l map[string]string) { l["other"] = "x" })).To(Succeed())
		g.Expect(alice.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns}})).To(Succeed())
		// Writes to labelled objects that leave the ring's labels alone do
		// not reach it either (matchConditions).
		assigned := labelled(ns, "assigned", map[string]string{shard: "inst-a"})
		g.Expect(sh.Create(ctx, assigned)).To(Succeed())
		for i := range 5 {
			assigned.Data = map[string]string{"k": strconv.Itoa(i)}
			g.Expect(inst.Update(ctx, assigned)).To(Succeed())
		}
		g.Expect(relabel(inst, assigned, func(l map[string]string) { l["other"] = "x" })).To(Succeed())
		g.Expect(webhookCalls(r.Name)).To(Equal(before), "requests that change no ring label reached the webhook")

		// The count does move when a label changes.
		expectDenied(g, relabel(alice, assigned, func(l map[string]string) { l[shard] = "inst-b" }), shard)
		g.Expect(webhookCalls(r.Name)).To(Equal(before + 1))
	})
}

func TestWebhookDownFollowsFailurePolicy(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	ignore := createRing(t, ns)
	fail := createRing(t, ns, func(r *v1alpha1.ControllerRing) {
		r.Spec.Webhook = &v1alpha1.RingWebhook{FailurePolicy: ptr.To(admissionregistrationv1.Fail)}
	})
	s := startSharder(t, webhook.Options{TimeoutSeconds: 2})
	probeIgnore := waitProtected(t, ignore.Name, ns)
	probeFail := waitProtected(t, fail.Name, ns)

	s.stop(t)
	alice := clientAs(t, userAlice)
	g.Expect(relabel(alice, probeIgnore, func(l map[string]string) { l[v1alpha1.ShardLabel(ignore.Name)] = "edited" })).
		To(Succeed(), "with the webhook down and policy Ignore, writes go through")
	err := relabel(alice, probeFail, func(l map[string]string) { l[v1alpha1.ShardLabel(fail.Name)] = "edited" })
	g.Expect(err).To(HaveOccurred(), "with the webhook down and policy Fail, label changes are rejected")
	g.Expect(err.Error()).To(ContainSubstring("failed calling webhook"))
	// Writes that change no label never needed the webhook.
	g.Expect(relabel(alice, probeFail, func(l map[string]string) { l["team"] = "a" })).To(Succeed())
}

func TestConfigurationFollowsRings(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	s := startSharder(t, webhook.Options{})
	get := func() (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
		c := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		return c, env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, c)
	}
	names := func() []string {
		c, err := get()
		if err != nil {
			return nil
		}
		var n []string
		for _, w := range c.Webhooks {
			n = append(n, w.Name)
		}
		return n
	}

	r1 := createRing(t, ns)
	g.Eventually(names).Should(Equal([]string{r1.Name + ".shard-label.sharder.dev", r1.Name + ".drain-label.sharder.dev"}))
	c, err := get()
	g.Expect(err).NotTo(HaveOccurred())
	for _, w := range c.Webhooks {
		g.Expect(w.Rules).To(HaveLen(1))
		g.Expect(w.Rules[0].Resources).To(Equal([]string{"configmaps", "configmaps/status", "secrets", "secrets/status"}))
		g.Expect(*w.FailurePolicy).To(Equal(admissionregistrationv1.Ignore))
		g.Expect(*w.SideEffects).To(Equal(admissionregistrationv1.SideEffectClassNone))
		g.Expect(*w.TimeoutSeconds).To(BeEquivalentTo(config.DefaultWebhookTimeoutSeconds))
		g.Expect(w.ClientConfig.CABundle).NotTo(BeEmpty())
	}

	// A changed ring changes its webhooks.
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(r1), r1)).To(Succeed())
	r1.Spec.Resources[0].ControlledResources = append(r1.Spec.Resources[0].ControlledResources, metav1.GroupResource{Group: "apps", Resource: "deployments"})
	r1.Spec.Webhook = &v1alpha1.RingWebhook{FailurePolicy: ptr.To(admissionregistrationv1.Fail)}
	g.Expect(env().Client.Update(ctx, r1)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c, err := get()
		g.Expect(err).NotTo(HaveOccurred())
		w := c.Webhooks[0]
		g.Expect(*w.FailurePolicy).To(Equal(admissionregistrationv1.Fail))
		g.Expect(w.Rules).To(HaveLen(2))
		g.Expect(w.Rules[1].APIGroups).To(Equal([]string{"apps"}))
		g.Expect(w.Rules[1].Resources).To(Equal([]string{"deployments", "deployments/status"}))
	}).Should(Succeed())

	// A second ring adds its webhooks; deleting it removes them.
	r2 := createRing(t, ns)
	g.Eventually(names).Should(HaveLen(4))
	g.Expect(env().Client.Delete(ctx, r2)).To(Succeed())
	g.Eventually(names).Should(HaveLen(2))

	// Someone else's edit is undone.
	g.Eventually(func() error {
		c, err := get()
		if err != nil {
			return err
		}
		c.Webhooks[0].TimeoutSeconds = ptr.To[int32](30)
		return env().Client.Update(ctx, c)
	}).Should(Succeed())
	g.Eventually(func() int32 {
		c, err := get()
		if err != nil || len(c.Webhooks) == 0 {
			return 0
		}
		return *c.Webhooks[0].TimeoutSeconds
	}).Should(BeEquivalentTo(config.DefaultWebhookTimeoutSeconds))

	// The configuration goes with the last ring.
	g.Expect(env().Client.Delete(ctx, r1)).To(Succeed())
	g.Eventually(func() bool { _, err := get(); return apierrors.IsNotFound(err) }).Should(BeTrue())
}

// servedCertificate returns the certificate a webhook server presents.
func servedCertificate(g Gomega, url string) *x509.Certificate {
	conn, err := tls.Dial("tcp", url[len("https://"):], &tls.Config{InsecureSkipVerify: true}) // inspecting the certificate, not trusting it
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

func TestCertificateRotatedWithoutRestart(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := createRing(t, ns)
	// A serving certificate renewed ten seconds after it is issued.
	s := startSharder(t, webhook.Options{
		CAValidity: 24 * time.Hour, CARenewBefore: time.Hour,
		CertValidity: time.Minute, CertRenewBefore: 50 * time.Second, CAPropagation: time.Minute,
	})
	probe := waitProtected(t, r.Name, ns)
	first := servedCertificate(g, s.opts.URL)

	// The inner Gomega: a failed dial is retried, not a failure of the test.
	g.Eventually(func(g Gomega) {
		g.Expect(servedCertificate(g, s.opts.URL).SerialNumber.Cmp(first.SerialNumber)).NotTo(BeZero(), "the same certificate")
	}).WithTimeout(40 * time.Second).WithPolling(time.Second).Should(Succeed())
	second := servedCertificate(g, s.opts.URL)
	g.Expect(second.NotAfter.After(first.NotAfter)).To(BeTrue())

	secret := &corev1.Secret{}
	g.Expect(env().Client.Get(context.Background(), types.NamespacedName{Namespace: sharderNamespace, Name: s.opts.SecretName}, secret)).To(Succeed())
	block, _ := pem.Decode(secret.Data[corev1.TLSCertKey])
	g.Expect(block.Bytes).To(Equal(second.Raw), "the served certificate is the stored one")

	// The API server still trusts the webhook: the same CA signed both.
	alice := clientAs(t, userAlice)
	expectDenied(g, relabel(alice, probe, func(l map[string]string) { l[v1alpha1.ShardLabel(r.Name)] = "x" }), "set by the sharder")
}

func TestReplicasShareTheCertificate(t *testing.T) {
	g := NewWithT(t)
	opts := webhook.Options{SecretName: "shared-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	a, b := startSharder(t, opts), startSharder(t, opts)
	g.Eventually(func(g Gomega) {
		ca, cb := servedCertificate(g, a.opts.URL), servedCertificate(g, b.opts.URL)
		g.Expect(ca.Raw).To(Equal(cb.Raw))
	}).WithTimeout(20 * time.Second).Should(Succeed())
}

func TestExternalCertificatesWithInjectedCA(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)

	// What cert-manager would mount: a certificate for 127.0.0.1 and its CA.
	dir := t.TempDir()
	res, err := pki.Reconcile(nil, pki.Config{Hosts: []string{"127.0.0.1"}, CAValidity: 24 * time.Hour, CARenewBefore: 2 * time.Hour,
		CertValidity: time.Hour, CertRenewBefore: 10 * time.Minute}, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	for k, v := range res.Data {
		g.Expect(os.WriteFile(filepath.Join(dir, k), v, 0o600)).To(Succeed())
	}

	r := createRing(t, ns)
	s := startSharder(t, webhook.Options{CertMode: config.CertModeExternal, CAInjectFrom: "sharder-system/sharder-webhook"},
		func(o *ctrlwebhook.Options) { o.CertDir = dir })
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, cfg)).To(Succeed())
		g.Expect(cfg.Annotations).To(HaveKeyWithValue("cert-manager.io/inject-ca-from", "sharder-system/sharder-webhook"))
		g.Expect(cfg.Webhooks).To(HaveLen(2))
	}).Should(Succeed())
	for _, w := range cfg.Webhooks {
		g.Expect(w.ClientConfig.CABundle).To(BeEmpty(), "the sharder must leave the bundle to cert-manager")
	}

	// Play cert-manager's CA injector.
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].ClientConfig.CABundle = res.Data[pki.KeyCABundle]
	}
	g.Expect(env().Client.Update(ctx, cfg)).To(Succeed())
	waitProtected(t, r.Name, ns)

	// A new ring's webhooks get the injected bundle too.
	r2 := createRing(t, ns)
	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, cfg)).To(Succeed())
		g.Expect(cfg.Webhooks).To(HaveLen(4))
		for _, w := range cfg.Webhooks {
			g.Expect(w.ClientConfig.CABundle).To(Equal(res.Data[pki.KeyCABundle]))
		}
	}).Should(Succeed())
	waitProtected(t, r2.Name, ns)
	g.Expect(slices.ContainsFunc(cfg.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool {
		return w.Name == r2.Name+".shard-label.sharder.dev"
	})).To(BeTrue())
}

func TestExternalCertificatesWithCAFile(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	dir := t.TempDir()
	res, err := pki.Reconcile(nil, pki.Config{Hosts: []string{"127.0.0.1"}, CAValidity: 24 * time.Hour, CARenewBefore: 2 * time.Hour,
		CertValidity: time.Hour, CertRenewBefore: 10 * time.Minute}, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	for k, v := range res.Data {
		g.Expect(os.WriteFile(filepath.Join(dir, k), v, 0o600)).To(Succeed())
	}
	r := createRing(t, ns)
	startSharder(t, webhook.Options{CertMode: config.CertModeExternal}, func(o *ctrlwebhook.Options) { o.CertDir = dir })
	// The bundle comes from ca.crt in the server's certificate folder.
	waitProtected(t, r.Name, ns)
}

// warnings collects the warnings the API server returns.
type warnings struct {
	mu   sync.Mutex
	text []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.text = append(w.text, text)
}

func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.text)
}

// TestFaultsFollowFailurePolicy sends the running webhook requests for rings
// it does not know, through a configuration written here: under Ignore they
// are allowed with a warning, under Fail rejected.
func TestFaultsFollowFailurePolicy(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := createRing(t, ns)
	s := startSharder(t, webhook.Options{})
	waitProtected(t, r.Name, ns)

	secret := &corev1.Secret{}
	g.Expect(env().Client.Get(ctx, types.NamespacedName{Namespace: sharderNamespace, Name: s.opts.SecretName}, secret)).To(Succeed())
	ghost := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "ghost-rings-" + ns}}
	for _, policy := range []admissionregistrationv1.FailurePolicyType{admissionregistrationv1.Ignore, admissionregistrationv1.Fail} {
		ring := "ghost-" + strings.ToLower(string(policy))
		ghost.Webhooks = append(ghost.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name: ring + ".test.sharder.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				URL:      ptr.To(s.opts.URL + webhook.PathPrefix + ring + "/" + strings.ToLower(string(policy))),
				CABundle: secret.Data["ca.crt"],
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelNamespaceName: ns}},
			ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: v1alpha1.ShardLabel(ring), Operator: metav1.LabelSelectorOpExists}}},
			FailurePolicy:           ptr.To(policy),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		})
	}
	g.Expect(env().Client.Create(ctx, ghost)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), ghost) })

	cfg := configAs(t, userAlice)
	collected := &warnings{}
	cfg.WarningHandler = collected
	alice, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())

	// Fail: rejected, naming the ring.
	g.Eventually(func() string {
		_, err := alice.CoreV1().ConfigMaps(ns).Create(ctx, labelled(ns, "ghost-fail", map[string]string{v1alpha1.ShardLabel("ghost-fail"): "x"}),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return "allowed"
		}
		return err.Error()
	}).WithTimeout(10 * time.Second).Should(ContainSubstring(`cannot check labels of ring "ghost-fail"`))

	// Ignore: allowed, with a warning naming the ring.
	cm := labelled(ns, "ghost-ignore", map[string]string{v1alpha1.ShardLabel("ghost-ignore"): "x"})
	_, err = alice.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(collected.all()).To(ContainElement(And(ContainSubstring(`ring "ghost-ignore"`), ContainSubstring("not found"))))
}
