package controller

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// rootUser is the etcd user the operator authenticates as when auth is on.
const rootUser = "root"

// Names of the Secrets the operator makes for a cluster.
func caSecretName(c *etcdv1alpha1.EtcdCluster) string   { return c.Name + "-ca" }
func rootSecretName(c *etcdv1alpha1.EtcdCluster) string { return c.Name + "-root" }
func certSecretName(c *etcdv1alpha1.EtcdCluster, role certRole) string {
	return c.Name + "-" + role.name + "-tls"
}

// tlsOn, clientTLS, peerTLS and authOn read the security settings.
func tlsOn(s etcdv1alpha1.EtcdClusterSpec) bool     { return s.Security.TLS != nil }
func clientTLS(s etcdv1alpha1.EtcdClusterSpec) bool { return tlsOn(s) && s.Security.TLS.Client }
func peerTLS(s etcdv1alpha1.EtcdClusterSpec) bool   { return tlsOn(s) && s.Security.TLS.Peer }
func authOn(s etcdv1alpha1.EtcdClusterSpec) bool {
	return s.Security.Auth != nil && s.Security.Auth.Enabled
}

// operatorIssued reports whether the operator issues the cluster's
// certificates.
func operatorIssued(s etcdv1alpha1.EtcdClusterSpec) bool {
	return tlsOn(s) && s.Security.TLS.Source != etcdv1alpha1.CertificateSourceSecrets
}

// tlsSecretName is the Secret holding the certificate of role that the
// cluster uses: the operator's, or the one the user names.
func tlsSecretName(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec, role certRole) string {
	if operatorIssued(s) {
		return certSecretName(c, role)
	}
	switch role.name {
	case roleServer.name:
		return s.Security.TLS.Secrets.Server
	case rolePeer.name:
		return s.Security.TLS.Secrets.Peer
	}
	return s.Security.TLS.Secrets.Client
}

// rootPassword is where the root password is: Secret name and key.
func rootPassword(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) (string, string) {
	if ref := s.Security.Auth.RootPasswordSecret; ref != nil {
		key := ref.Key
		if key == "" {
			key = etcdv1alpha1.DefaultRootPasswordKey
		}
		return ref.Name, key
	}
	return rootSecretName(c), etcdv1alpha1.DefaultRootPasswordKey
}

// tlsDurations are the validity and renew-before of issued certificates.
func tlsDurations(s etcdv1alpha1.EtcdClusterSpec) (validity, renewBefore time.Duration) {
	validity, _ = time.ParseDuration(etcdv1alpha1.DefaultCertificateValidity)
	renewBefore, _ = time.ParseDuration(etcdv1alpha1.DefaultCertificateRenewBefore)
	if d := s.Security.TLS.Validity; d != nil && d.Duration > 0 {
		validity = d.Duration
	}
	if d := s.Security.TLS.RenewBefore; d != nil && d.Duration > 0 && d.Duration < validity {
		renewBefore = d.Duration
	}
	if renewBefore >= validity {
		renewBefore = validity / 3
	}
	return validity, renewBefore
}

// secretObjects are the Secrets the operator may have made for c, for
// deletion (only those c controls are deleted).
func secretObjects(c *etcdv1alpha1.EtcdCluster) []*corev1.Secret {
	names := []string{caSecretName(c), certSecretName(c, roleServer), certSecretName(c, rolePeer),
		certSecretName(c, roleClient), rootSecretName(c)}
	out := make([]*corev1.Secret, 0, len(names))
	for _, name := range names {
		out = append(out, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: name}})
	}
	return out
}

// ensureSecurity makes the Secrets TLS and auth need and reports the
// certificates in c's status. It returns how soon a certificate is due for
// renewal (0: none is). Bad user Secrets are reported in the
// CertificatesReady condition and an event, not as an error: the members
// wait for them (their volumes do not mount), and the cluster is asked
// again after the usual interval.
func (r *Reconciler) ensureSecurity(ctx context.Context, c *etcdv1alpha1.EtcdCluster) (time.Duration, error) {
	s := spec(c)
	if authOn(s) && s.Security.Auth.RootPasswordSecret == nil {
		if _, err := r.ensureSecret(ctx, c, rootSecretName(c), corev1.SecretTypeOpaque, func(cur map[string][]byte) (map[string][]byte, string, error) {
			if len(cur[etcdv1alpha1.DefaultRootPasswordKey]) > 0 {
				return cur, "", nil
			}
			password, err := randomPassword()
			return map[string][]byte{etcdv1alpha1.DefaultRootPasswordKey: []byte(password)}, "root password", err
		}); err != nil {
			return 0, err
		}
	}
	if !tlsOn(s) {
		meta.RemoveStatusCondition(&c.Status.Conditions, etcdv1alpha1.ConditionCertificatesReady)
		c.Status.CertificatesNotAfter = nil
		return 0, nil
	}
	if !operatorIssued(s) {
		return 0, r.checkProvided(ctx, c, s)
	}

	now := r.opts.Clock.Now()
	validity, renewBefore := tlsDurations(s)
	var ca keyPair
	caData, err := r.ensureSecret(ctx, c, caSecretName(c), corev1.SecretTypeTLS, func(cur map[string][]byte) (map[string][]byte, string, error) {
		if pair, err := parseKeyPair(cur[keyCert], cur[keyKey]); err == nil && pair.cert.IsCA {
			ca = pair
			return cur, "", nil
		}
		// The CA is made once: members trust the CA they started with.
		var err error
		ca, err = newCA(c, now, caValidityFactor*validity)
		return map[string][]byte{keyCert: ca.certPEM, keyKey: ca.keyPEM}, "CA", err
	})
	if err != nil {
		return 0, err
	}
	if ca.cert == nil {
		if ca, err = parseKeyPair(caData[keyCert], caData[keyKey]); err != nil {
			return 0, fmt.Errorf("reading the CA: %w", err)
		}
	}

	// The CA is never renewed; once it is near its end, renewing the
	// certificates it signs (which end with it) would only churn.
	caNear := !now.Before(ca.cert.NotAfter.Add(-renewBefore))
	leafRenewBefore := renewBefore
	if caNear {
		leafRenewBefore = 0
	}
	notAfter := ca.cert.NotAfter
	roles := []certRole{roleServer, roleClient}
	if peerTLS(s) {
		roles = []certRole{roleServer, rolePeer, roleClient}
	}
	for _, role := range roles {
		data, err := r.ensureSecret(ctx, c, certSecretName(c, role), corev1.SecretTypeTLS, func(cur map[string][]byte) (map[string][]byte, string, error) {
			why := reissueReason(c, role, ca, cur, now, leafRenewBefore)
			if why == "" {
				return cur, "", nil
			}
			pair, err := issue(c, role, ca, now, validity)
			return map[string][]byte{keyCert: pair.certPEM, keyKey: pair.keyPEM, keyCA: ca.certPEM},
				fmt.Sprintf("%s certificate (%s)", role.name, why), err
		})
		if err != nil {
			return 0, err
		}
		pair, err := parseKeyPair(data[keyCert], data[keyKey])
		if err != nil {
			return 0, fmt.Errorf("reading the %s certificate: %w", role.name, err)
		}
		if pair.cert.NotAfter.Before(notAfter) {
			notAfter = pair.cert.NotAfter
		}
	}
	if caNear {
		r.setCertificates(c, metav1.ConditionFalse, etcdv1alpha1.ReasonCAExpiring, notAfter,
			fmt.Sprintf("the cluster's CA expires at %s and is not renewed by the operator", ca.cert.NotAfter.UTC().Format(time.RFC3339)))
		return 0, nil
	}
	r.setCertificates(c, metav1.ConditionTrue, etcdv1alpha1.ReasonCertificatesIssued, notAfter,
		fmt.Sprintf("issued by the cluster's CA, valid until %s, renewed %s before", notAfter.UTC().Format(time.RFC3339), renewBefore))
	return max(notAfter.Add(-renewBefore).Sub(now), time.Second), nil
}

// checkProvided checks the user's certificate Secrets, read from the API
// server (they carry no shard label and are not in the cache).
func (r *Reconciler) checkProvided(ctx context.Context, c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) error {
	roles := []certRole{roleServer, roleClient}
	if peerTLS(s) {
		roles = []certRole{roleServer, rolePeer, roleClient}
	}
	var notAfter time.Time
	for _, role := range roles {
		name := tlsSecretName(c, s, role)
		secret := &corev1.Secret{}
		err := r.opts.APIReader.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: name}, secret)
		if apierrors.IsNotFound(err) {
			err = errors.New("it does not exist")
		} else if err != nil {
			return fmt.Errorf("reading Secret %s: %w", name, err)
		}
		if err == nil {
			parsed, verr := verifyProvided(secret.Data, r.opts.Clock.Now())
			if verr == nil && (notAfter.IsZero() || parsed.NotAfter.Before(notAfter)) {
				notAfter = parsed.NotAfter
			}
			err = verr
		}
		if err != nil {
			msg := fmt.Sprintf("the %s certificate Secret %s is not usable: %v", role.name, name, err)
			if cond := meta.FindStatusCondition(c.Status.Conditions, etcdv1alpha1.ConditionCertificatesReady); cond == nil || cond.Message != msg {
				r.event(c, corev1.EventTypeWarning, etcdv1alpha1.ReasonSecretInvalid, "CheckCertificates", "%s", msg)
			}
			r.setCertificates(c, metav1.ConditionFalse, etcdv1alpha1.ReasonSecretInvalid, time.Time{}, msg)
			return nil
		}
	}
	r.setCertificates(c, metav1.ConditionTrue, etcdv1alpha1.ReasonCertificatesProvided, notAfter,
		fmt.Sprintf("provided by the user's Secrets, valid until %s", notAfter.UTC().Format(time.RFC3339)))
	return nil
}

func (r *Reconciler) setCertificates(c *etcdv1alpha1.EtcdCluster, status metav1.ConditionStatus, reason string, notAfter time.Time, msg string) {
	c.Status.CertificatesNotAfter = nil
	if !notAfter.IsZero() {
		c.Status.CertificatesNotAfter = ptrTime(notAfter)
	}
	r.setCondition(c, etcdv1alpha1.ConditionCertificatesReady, status, reason, msg)
}

// ensureSecret creates c's Secret name with the data want returns for none,
// or replaces an existing one's data when want returns a reason to. want
// gets the current data (nil when there is none) and returns the data to
// have, why it changed ("" if it did not), or an error. It returns the data
// the Secret has.
func (r *Reconciler) ensureSecret(ctx context.Context, c *etcdv1alpha1.EtcdCluster, name string, typ corev1.SecretType,
	want func(cur map[string][]byte) (map[string][]byte, string, error)) (map[string][]byte, error) {
	key := types.NamespacedName{Namespace: c.Namespace, Name: name}
	existing := &corev1.Secret{}
	err := r.client.Get(ctx, key, existing)
	if apierrors.IsNotFound(err) {
		data, what, err := want(nil)
		if err != nil {
			return nil, err
		}
		desired := &corev1.Secret{ObjectMeta: objectMeta(c, name), Type: typ, Data: data}
		if err := controllerutil.SetControllerReference(c, desired, r.scheme); err != nil {
			return nil, fmt.Errorf("setting the owner of Secret %s: %w", key, err)
		}
		r.opts.LabelChild(c, desired)
		if err := r.client.Create(ctx, desired); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Ours but not (yet) in the cache, e.g. just after the
				// cluster moved here: never issue anew what exists.
				return nil, r.explainHidden(ctx, c, desired)
			}
			return nil, classify(fmt.Errorf("creating Secret %s: %w", key, err))
		}
		log.FromContext(ctx).Info("Created Secret", "name", name, "content", what)
		r.event(c, corev1.EventTypeNormal, "SecretCreated", "Create", "Created Secret %s: %s", name, what)
		return data, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	if err := checkControlled(c, existing, "Secret"); err != nil {
		return nil, err
	}
	data, why, err := want(existing.Data)
	if err != nil {
		return nil, err
	}
	if why == "" {
		return existing.Data, nil
	}
	updated := existing.DeepCopy()
	updated.Data = data
	patch := client.MergeFromWithOptions(existing, client.MergeFromWithOptimisticLock{})
	if err := r.client.Patch(ctx, updated, patch); err != nil {
		return nil, classify(fmt.Errorf("updating Secret %s: %w", key, err))
	}
	log.FromContext(ctx).Info("Renewed Secret", "name", name, "reason", why)
	r.event(c, corev1.EventTypeNormal, "CertificateRenewed", "Renew", "Renewed Secret %s: %s", name, why)
	return data, nil
}

func randomPassword() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// clusterAccess returns how to authenticate to c's etcd, reading what it
// needs (the client certificate and the root password) through reader,
// which must see the user's Secrets as well as the operator's: a user's
// Secret carries no shard label, so a sharded instance passes a reader
// that falls back to the API server (Reconciler.secretReader). Every
// controller that talks to a cluster's etcd asks here.
func clusterAccess(ctx context.Context, reader client.Reader, c *etcdv1alpha1.EtcdCluster) (etcdAccess, error) {
	s := spec(c)
	var access etcdAccess
	if clientTLS(s) {
		name := tlsSecretName(c, s, roleClient)
		secret := &corev1.Secret{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: name}, secret); err != nil {
			return etcdAccess{}, fmt.Errorf("reading the client certificate Secret %s: %w", name, err)
		}
		cfg, err := clientTLSConfig(c, secret.Data)
		if err != nil {
			return etcdAccess{}, fmt.Errorf("the client certificate Secret %s: %w", name, err)
		}
		access.TLS = cfg
	}
	if authOn(s) {
		name, key := rootPassword(c, s)
		secret := &corev1.Secret{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: name}, secret); err != nil {
			return etcdAccess{}, fmt.Errorf("reading the root password Secret %s: %w", name, err)
		}
		if len(secret.Data[key]) == 0 {
			return etcdAccess{}, fmt.Errorf("the root password Secret %s has no key %q", name, key)
		}
		access.Username, access.Password = rootUser, string(secret.Data[key])
	}
	return access, nil
}

// secretReader reads Secrets from the cache and, for those not in it (the
// user's), from the API server.
func (r *Reconciler) secretReader() client.Reader {
	return fallbackReader{primary: r.client, fallback: r.opts.APIReader}
}

type fallbackReader struct{ primary, fallback client.Reader }

var _ client.Reader = fallbackReader{}

func (f fallbackReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := f.primary.Get(ctx, key, obj, opts...)
	if apierrors.IsNotFound(err) {
		return f.fallback.Get(ctx, key, obj, opts...)
	}
	return err
}

func (f fallbackReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return f.primary.List(ctx, list, opts...)
}

// ensureAuth turns etcd's authentication on when the spec asks for it and
// etcd answered: it creates the root user with the password from its
// Secret, grants it the root role and enables auth. It asks etcd each time
// (AuthStatus), so a step a previous reconcile did not finish is done now.
func (r *Reconciler) ensureAuth(ctx context.Context, c *etcdv1alpha1.EtcdCluster, access etcdAccess, endpoints []string, view etcdView) {
	s := spec(c)
	if !authOn(s) {
		meta.RemoveStatusCondition(&c.Status.Conditions, etcdv1alpha1.ConditionAuthEnabled)
		return
	}
	if !view.answered() {
		if cond := meta.FindStatusCondition(c.Status.Conditions, etcdv1alpha1.ConditionAuthEnabled); cond == nil || cond.Status != metav1.ConditionTrue {
			r.setCondition(c, etcdv1alpha1.ConditionAuthEnabled, metav1.ConditionFalse, etcdv1alpha1.ReasonAuthPending,
				"waiting for etcd to answer: "+view.err.Error())
		}
		return
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.EtcdTimeout)
	defer cancel()
	err := func() error {
		cli, err := newEtcdClient(ctx, access, endpoints, r.opts.EtcdTimeout)
		if err != nil {
			return err
		}
		defer func() { _ = cli.Close() }()
		st, err := cli.AuthStatus(ctx)
		if err != nil {
			return fmt.Errorf("asking etcd whether auth is on: %w", err)
		}
		if st.Enabled {
			return nil
		}
		if _, err := cli.UserAdd(ctx, rootUser, access.Password); errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			if _, err := cli.UserChangePassword(ctx, rootUser, access.Password); err != nil {
				return fmt.Errorf("setting the root password: %w", err)
			}
		} else if err != nil {
			return fmt.Errorf("adding the root user: %w", err)
		}
		if _, err := cli.UserGrantRole(ctx, rootUser, rootUser); err != nil {
			return fmt.Errorf("granting the root role: %w", err)
		}
		if _, err := cli.AuthEnable(ctx); err != nil {
			return fmt.Errorf("enabling auth: %w", err)
		}
		log.FromContext(ctx).Info("Enabled etcd authentication")
		r.event(c, corev1.EventTypeNormal, "AuthEnabled", "EnableAuth", "Enabled etcd authentication with the root user")
		return nil
	}()
	if err != nil {
		r.setCondition(c, etcdv1alpha1.ConditionAuthEnabled, metav1.ConditionFalse, etcdv1alpha1.ReasonAuthFailed, err.Error())
		return
	}
	name, _ := rootPassword(c, s)
	r.setCondition(c, etcdv1alpha1.ConditionAuthEnabled, metav1.ConditionTrue, etcdv1alpha1.ReasonAuthEnabled,
		"etcd authenticates every request; the operator is root, with the password in Secret "+name)
}

// Where members find their certificates: Secret volumes, which the kubelet
// refreshes when the Secrets change (etcd reads the certificate and key
// files again for every new connection).
const (
	tlsServerDir    = "/etc/etcd/tls/server"
	tlsPeerDir      = "/etc/etcd/tls/peer"
	tlsServerVolume = "tls-server"
	tlsPeerVolume   = "tls-peer"
	metricsPortName = "metrics"
)

// tlsConfigData is the etcd configuration TLS adds to the ConfigMap. All
// members trust the CA in the server Secret's ca.crt, for clients and peers.
func tlsConfigData(s etcdv1alpha1.EtcdClusterSpec) map[string]string {
	data := map[string]string{}
	if clientTLS(s) {
		data["ETCD_CERT_FILE"] = tlsServerDir + "/" + keyCert
		data["ETCD_KEY_FILE"] = tlsServerDir + "/" + keyKey
		data["ETCD_TRUSTED_CA_FILE"] = tlsServerDir + "/" + keyCA
		data["ETCD_CLIENT_CERT_AUTH"] = "true"
		// /health without a client certificate, for the readiness probe.
		data["ETCD_LISTEN_METRICS_URLS"] = fmt.Sprintf("http://0.0.0.0:%d", etcdv1alpha1.MetricsPort)
	}
	if peerTLS(s) {
		data["ETCD_PEER_CERT_FILE"] = tlsServerDir + "/" + keyCert
		data["ETCD_PEER_KEY_FILE"] = tlsServerDir + "/" + keyKey
		data["ETCD_PEER_TRUSTED_CA_FILE"] = tlsServerDir + "/" + keyCA
		data["ETCD_PEER_CLIENT_CERT_AUTH"] = "true"
		// Members present a certificate without names to each other (etcd
		// would check a name against the connecting pod's address).
		data["ETCD_PEER_CLIENT_CERT_FILE"] = tlsPeerDir + "/" + keyCert
		data["ETCD_PEER_CLIENT_KEY_FILE"] = tlsPeerDir + "/" + keyKey
	}
	return data
}

// tlsVolumes are the certificate Secret volumes of the members.
func tlsVolumes(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) []corev1.Volume {
	if !tlsOn(s) {
		return nil
	}
	vol := func(name string, role certRole) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: tlsSecretName(c, s, role),
		}}}
	}
	out := []corev1.Volume{vol(tlsServerVolume, roleServer)}
	if peerTLS(s) {
		out = append(out, vol(tlsPeerVolume, rolePeer))
	}
	return out
}

// addTLS mounts the certificates into the etcd container and, with client
// TLS, probes readiness on the plain metrics listener.
func addTLS(s etcdv1alpha1.EtcdClusterSpec, container *corev1.Container) {
	if !tlsOn(s) {
		return
	}
	container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: tlsServerVolume, MountPath: tlsServerDir, ReadOnly: true})
	if peerTLS(s) {
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: tlsPeerVolume, MountPath: tlsPeerDir, ReadOnly: true})
	}
	if clientTLS(s) {
		container.Ports = append(container.Ports, corev1.ContainerPort{
			Name: metricsPortName, ContainerPort: etcdv1alpha1.MetricsPort, Protocol: corev1.ProtocolTCP,
		})
		container.ReadinessProbe.HTTPGet.Port = intstr.FromString(metricsPortName)
	}
}
