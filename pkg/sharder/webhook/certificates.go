package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/sharder/webhook/internal/pki"
)

// +kubebuilder:rbac:groups="",namespace=sharder-system,resources=secrets,verbs=get;update,resourceNames=sharder-webhook-tls
// +kubebuilder:rbac:groups="",namespace=sharder-system,resources=secrets,verbs=create

// certificates keeps the self-managed CA and serving certificate in a Secret
// and serves them from memory. It runs on every replica: each one reads the
// Secret, rotates what is due (optimistic locking: when replicas race, one
// write wins and the others re-read and find nothing left to do) and serves
// the stored certificate. A certificate another replica stored is picked up
// within ResyncPeriod; rotation starts long before expiry, so that delay
// never matters.
type certificates struct {
	client client.Client // uncached reads and writes of one Secret
	key    types.NamespacedName
	cfg    pki.Config
	clock  clock.Clock
	resync time.Duration
	// changed is called (without blocking) when the CA bundle changes.
	changed func()

	mu       sync.RWMutex
	cert     *tls.Certificate
	caBundle []byte
}

// NeedLeaderElection is false: every replica serves the webhook.
func (c *certificates) NeedLeaderElection() bool { return false }

// Start keeps the material current until ctx ends.
func (c *certificates) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithValues("secret", c.key)
	backoff := time.Second
	for {
		wait := c.resync
		next, err := c.sync(ctx)
		switch {
		case err != nil:
			log.Error(err, "Keeping the webhook certificate failed; retrying", "after", backoff)
			wait, backoff = backoff, min(2*backoff, c.resync)
		default:
			backoff = time.Second
			if d := next.Sub(c.clock.Now()); d < wait {
				wait = max(d, time.Second)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.clock.After(wait):
		}
	}
}

// sync reads the Secret, stores what must change and loads the result. It
// returns when it has something to do next.
func (c *certificates) sync(ctx context.Context) (time.Time, error) {
	for attempt := 0; ; attempt++ {
		secret := &corev1.Secret{}
		err := c.client.Get(ctx, c.key, secret)
		exists := err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			return time.Time{}, fmt.Errorf("reading Secret %s: %w", c.key, err)
		}
		res, err := pki.Reconcile(secret.Data, c.cfg, c.clock.Now())
		if err != nil {
			return time.Time{}, err
		}
		if res.Changed {
			secret.Data = res.Data
			secret.Type = corev1.SecretTypeTLS
			if exists {
				err = c.client.Update(ctx, secret)
			} else {
				secret.ObjectMeta = metav1.ObjectMeta{Name: c.key.Name, Namespace: c.key.Namespace,
					Labels: map[string]string{"app.kubernetes.io/managed-by": "sharder"}}
				err = c.client.Create(ctx, secret)
			}
			if (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) && attempt < 3 {
				continue // another replica wrote first: decide again on its material
			}
			if err != nil {
				return time.Time{}, fmt.Errorf("writing Secret %s: %w", c.key, err)
			}
			logf.FromContext(ctx).Info("Webhook certificate updated", "secret", c.key, "changes", res.Reasons)
		}
		if err := c.load(res.Data); err != nil {
			return time.Time{}, err
		}
		return res.Next, nil
	}
}

func (c *certificates) load(data map[string][]byte) error {
	pair, err := tls.X509KeyPair(data[pki.KeyCert], data[pki.KeyKey])
	if err != nil {
		return fmt.Errorf("loading the serving certificate of Secret %s: %w", c.key, err)
	}
	c.mu.Lock()
	bundleChanged := !bytes.Equal(c.caBundle, data[pki.KeyCABundle])
	c.cert, c.caBundle = &pair, bytes.Clone(data[pki.KeyCABundle])
	c.mu.Unlock()
	if bundleChanged && c.changed != nil {
		c.changed()
	}
	return nil
}

var errNotLoaded = errors.New("the webhook serving certificate is not loaded yet")

// GetCertificate serves the current certificate (tls.Config.GetCertificate).
func (c *certificates) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.cert == nil {
		return nil, errNotLoaded
	}
	return c.cert, nil
}

// CABundle returns the CA certificates clients must trust (PEM), or nil
// before the first load.
func (c *certificates) CABundle() []byte {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.caBundle
}

// Check is a readiness check: ready once a certificate is loaded.
func (c *certificates) Check(*http.Request) error {
	_, err := c.GetCertificate(nil)
	return err
}
