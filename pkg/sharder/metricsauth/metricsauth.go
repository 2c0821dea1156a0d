// Package metricsauth protects the sharder's metrics endpoint: a caller must
// authenticate with a bearer token, which the API server reviews
// (TokenReview), and be allowed get on the endpoint's path, which the API
// server decides (SubjectAccessReview). It is what controller-runtime's
// metrics filter (sigs.k8s.io/controller-runtime/pkg/metrics/filters) does,
// with the same caches, timeouts, retries and answers, without that
// package's dependency on k8s.io/apiserver: its delegating authenticator and
// authorizer link gRPC, OpenTelemetry, CEL and the API server's
// authentication machinery into the binary (250 packages, a third of the
// sharder's executable), whose init functions run in every sharder process,
// metrics served securely or not, and keep those pages of the executable
// resident, for two API calls a scrape.
//
// The one difference: the API server's delegating authenticator also reads
// a token from a WebSocket upgrade's Sec-WebSocket-Protocol header; a
// metrics endpoint serves no WebSocket, so only the Authorization header is
// read.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The settings of controller-runtime's filter (and of the API server's
// delegating authentication and authorization).
const (
	// TokenCacheTTL is how long a token review's answer, authenticated or
	// not, is reused.
	TokenCacheTTL = time.Minute
	// TokenReviewTimeout bounds one token review, its retries included.
	TokenReviewTimeout = 10 * time.Second
	// AllowCacheTTL is how long an access review that allowed is reused.
	AllowCacheTTL = 5 * time.Minute
	// DenyCacheTTL is how long an access review that did not allow is reused.
	DenyCacheTTL = 30 * time.Second

	// maxCachedPath is the longest request path whose access review is
	// cached (the API server's webhook authorizer's limit).
	maxCachedPath = 10000
	// sweepAt is the cache size at which an insertion drops the expired
	// entries first.
	sweepAt = 1024
)

// retryBackoff is the retry of a review that failed transiently: the API
// server's DefaultAuthWebhookRetryBackoff, as controller-runtime copies it.
var retryBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// authenticatedGroup is the group every authenticated user is in.
const authenticatedGroup = "system:authenticated"

// errInvalidToken is the answer for a token the API server did not
// authenticate (the API server's bearer token authenticator's).
var errInvalidToken = errors.New("invalid bearer token")

// TokenReviewer creates TokenReviews.
type TokenReviewer interface {
	Create(ctx context.Context, review *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// AccessReviewer creates SubjectAccessReviews.
type AccessReviewer interface {
	Create(ctx context.Context, review *authorizationv1.SubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error)
}

// WithAuthenticationAndAuthorization is a metrics server FilterProvider
// (metricsserver.Options.FilterProvider): requests are authenticated with
// TokenReviews and authorized with SubjectAccessReviews against the API
// server of config. The sharder needs create on tokenreviews
// (authentication.k8s.io) and subjectaccessreviews (authorization.k8s.io);
// a scraper needs get on the nonResourceURL /metrics.
func WithAuthenticationAndAuthorization(config *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	authn, err := authenticationclient.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	authz, err := authorizationclient.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	return New(authn.TokenReviews(), authz.SubjectAccessReviews()).Filter, nil
}

// Auth authenticates and authorizes requests with the API server's reviews.
type Auth struct {
	tokens   TokenReviewer
	access   AccessReviewer
	backoff  wait.Backoff
	now      func() time.Time
	tokenTTL time.Duration

	authn *ttlCache[tokenAnswer]
	authz *ttlCache[authorizationv1.SubjectAccessReviewStatus]
}

// New returns an Auth that reviews with tokens and access.
func New(tokens TokenReviewer, access AccessReviewer) *Auth {
	return &Auth{
		tokens:   tokens,
		access:   access,
		backoff:  retryBackoff,
		now:      time.Now,
		tokenTTL: TokenCacheTTL,
		authn:    newTTLCache[tokenAnswer](),
		authz:    newTTLCache[authorizationv1.SubjectAccessReviewStatus](),
	}
}

// Filter wraps handler: it serves a request only for a caller allowed to
// get its path. Answers: 401 without a bearer token, 500 when the token is
// not authenticated or a review fails, 403 when not allowed (as
// controller-runtime's filter answers).
func (a *Auth) Filter(log logr.Logger, handler http.Handler) (http.Handler, error) {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u, ok, err := a.authenticate(req)
		if err != nil {
			log.Error(err, "Authentication failed")
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		}
		if !ok {
			log.V(4).Info("Authentication failed")
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		allowed, reason, err := a.authorize(req.Context(), u, strings.ToLower(req.Method), req.URL.Path)
		if err != nil {
			msg := fmt.Sprintf("Authorization for user %s failed", u.Username)
			log.Error(err, msg)
			http.Error(w, msg, http.StatusInternalServerError)
			return
		}
		if !allowed {
			msg := fmt.Sprintf("Authorization denied for user %s", u.Username)
			log.V(4).Info(fmt.Sprintf("%s: %s", msg, reason))
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		handler.ServeHTTP(w, req)
	}), nil
}

// tokenAnswer is a token review's answer: the user, or none.
type tokenAnswer struct {
	user          authenticationv1.UserInfo
	authenticated bool
}

// bearerToken returns the request's bearer token, as the API server's
// bearer token authenticator reads it.
func bearerToken(req *http.Request) (string, bool) {
	auth := strings.TrimSpace(req.Header.Get("Authorization"))
	if auth == "" {
		return "", false
	}
	parts := strings.SplitN(auth, " ", 3)
	if len(parts) < 2 || strings.ToLower(parts[0]) != "bearer" || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}

// authenticate returns the request's user: false without a bearer token, an
// error for a token the API server did not authenticate or a review that
// failed. The user is in system:authenticated. A request authenticated
// loses its Authorization header.
func (a *Auth) authenticate(req *http.Request) (authenticationv1.UserInfo, bool, error) {
	token, ok := bearerToken(req)
	if !ok {
		return authenticationv1.UserInfo{}, false, nil
	}
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	answer, cached := a.authn.get(key, a.now())
	if !cached {
		var err error
		if answer, err = a.reviewToken(req.Context(), token); err != nil {
			return authenticationv1.UserInfo{}, false, err
		}
		a.authn.add(key, answer, a.now(), a.tokenTTL)
	}
	if !answer.authenticated {
		return authenticationv1.UserInfo{}, false, errInvalidToken
	}
	req.Header.Del("Authorization")
	u := answer.user
	if u.Username != "system:anonymous" && !slices.Contains(u.Groups, authenticatedGroup) && !slices.Contains(u.Groups, "system:unauthenticated") {
		u.Groups = append(slices.Clip(u.Groups), authenticatedGroup)
	}
	return u, true, nil
}

// reviewToken asks the API server who token is. An answer that names no
// user, with an error in its status, is an error, not cached.
func (a *Auth) reviewToken(ctx context.Context, token string) (tokenAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, TokenReviewTimeout)
	defer cancel()
	var result *authenticationv1.TokenReview
	err := a.retry(ctx, func() error {
		var err error
		result, err = a.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return tokenAnswer{}, err
	}
	if !result.Status.Authenticated {
		if result.Status.Error != "" {
			return tokenAnswer{}, errors.New(result.Status.Error)
		}
		return tokenAnswer{}, nil
	}
	return tokenAnswer{user: result.Status.User, authenticated: true}, nil
}

// authorize asks the API server whether u may verb path.
func (a *Auth) authorize(ctx context.Context, u authenticationv1.UserInfo, verb, path string) (bool, string, error) {
	spec := authorizationv1.SubjectAccessReviewSpec{
		User:                  u.Username,
		UID:                   u.UID,
		Groups:                u.Groups,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
	}
	if u.Extra != nil {
		spec.Extra = make(map[string]authorizationv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return false, "", err
	}
	key := string(raw)
	status, cached := a.authz.get(key, a.now())
	if !cached {
		var result *authorizationv1.SubjectAccessReview
		err := a.retry(ctx, func() error {
			var err error
			result, err = a.access.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return false, "", err
		}
		status = result.Status
		if len(path)+len(verb) < maxCachedPath {
			ttl := DenyCacheTTL
			if status.Allowed {
				ttl = AllowCacheTTL
			}
			a.authz.add(key, status, a.now(), ttl)
		}
	}
	switch {
	case status.Denied && status.Allowed:
		return false, status.Reason, errors.New("webhook subject access review returned both allow and deny response")
	case status.Denied:
		return false, status.Reason, nil
	default:
		return status.Allowed, status.Reason, nil
	}
}

// retry calls fn until it succeeds, fails for good or the backoff ends,
// retrying the errors the API server's webhook clients retry.
func (a *Auth) retry(ctx context.Context, fn func() error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, a.backoff, func(context.Context) (bool, error) {
		last = fn()
		switch {
		case last == nil:
			return true, nil
		case shouldRetry(last):
			return false, nil
		default:
			return false, last
		}
	})
	switch {
	case last != nil:
		return last
	case err != nil:
		return fmt.Errorf("webhook call failed: %w", err)
	default:
		return nil
	}
}

// shouldRetry reports whether err is transient (the API server's
// webhook.DefaultShouldRetry).
func shouldRetry(err error) bool {
	if utilnet.IsConnectionReset(err) || utilnet.IsHTTP2ConnectionLost(err) || apierrors.IsInternalError(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) {
		return true
	}
	_, retry := apierrors.SuggestsClientDelay(err)
	return retry
}

// ttlCache holds answers until they expire.
type ttlCache[V any] struct {
	mu      sync.Mutex
	entries map[string]ttlEntry[V]
}

type ttlEntry[V any] struct {
	value   V
	expires time.Time
}

func newTTLCache[V any]() *ttlCache[V] {
	return &ttlCache[V]{entries: map[string]ttlEntry[V]{}}
}

func (c *ttlCache[V]) get(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || !now.Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.value, true
}

// add holds value for ttl from now. At sweepAt entries it drops the
// expired ones first, so that the cache holds about the answers of the last
// TTL.
func (c *ttlCache[V]) add(key string, value V, now time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= sweepAt {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
	}
	c.entries[key] = ttlEntry[V]{value: value, expires: now.Add(ttl)}
}
