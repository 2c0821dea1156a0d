package metricsauth

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// fakeTokens answers token reviews from a table of tokens.
type fakeTokens struct {
	mu      sync.Mutex
	users   map[string]authenticationv1.UserInfo
	errs    []error // returned first, one per call
	status  string  // Status.Error of unauthenticated answers
	reviews int
}

func (f *fakeTokens) Create(_ context.Context, r *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reviews++
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return nil, err
	}
	out := r.DeepCopy()
	if u, ok := f.users[r.Spec.Token]; ok {
		out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u}
	} else {
		out.Status = authenticationv1.TokenReviewStatus{Error: f.status}
	}
	return out, nil
}

// fakeAccess answers access reviews: allowed for the users in allow.
type fakeAccess struct {
	mu      sync.Mutex
	allow   map[string]bool
	both    bool
	errs    []error
	specs   []authorizationv1.SubjectAccessReviewSpec
	reviews int
}

func (f *fakeAccess) Create(_ context.Context, r *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reviews++
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return nil, err
	}
	f.specs = append(f.specs, r.Spec)
	out := r.DeepCopy()
	out.Status.Allowed = f.allow[r.Spec.User]
	out.Status.Denied = f.both
	return out, nil
}

type fixture struct {
	tokens  *fakeTokens
	access  *fakeAccess
	auth    *Auth
	now     time.Time
	handler http.Handler
	// header is the Authorization header the wrapped handler saw.
	header string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{
		tokens: &fakeTokens{users: map[string]authenticationv1.UserInfo{
			"scraper-token":  {Username: "system:serviceaccount:monitoring:scraper", UID: "u1", Groups: []string{"system:serviceaccounts"}, Extra: map[string]authenticationv1.ExtraValue{"k": {"v"}}},
			"stranger-token": {Username: "stranger"},
			"member-token":   {Username: "member", Groups: []string{"system:authenticated"}},
		}},
		access: &fakeAccess{allow: map[string]bool{"system:serviceaccount:monitoring:scraper": true, "member": true}},
		now:    time.Unix(1000, 0),
	}
	f.auth = New(f.tokens, f.access)
	f.auth.now = func() time.Time { return f.now }
	f.auth.backoff = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 3}
	h, err := f.auth.Filter(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.header = r.Header.Get("Authorization")
		_, _ = w.Write([]byte("metrics"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	f.handler = h
	return f
}

func (f *fixture) get(authorization string) int {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	f.handler.ServeHTTP(rec, req)
	return rec.Code
}

func TestFilterAnswers(t *testing.T) {
	for _, tc := range []struct {
		name          string
		authorization string
		want          int
		tokenReviews  int
		accessReviews int
	}{
		{"no token", "", http.StatusUnauthorized, 0, 0},
		{"not a bearer token", "Basic c2NyYXBlcjpzZWNyZXQ=", http.StatusUnauthorized, 0, 0},
		{"empty bearer token", "Bearer ", http.StatusUnauthorized, 0, 0},
		{"space before the token", "Bearer  scraper-token", http.StatusUnauthorized, 0, 0},
		{"token not authenticated", "Bearer forged", http.StatusInternalServerError, 1, 0},
		{"authenticated, not allowed", "Bearer stranger-token", http.StatusForbidden, 1, 1},
		{"authenticated and allowed", "Bearer scraper-token", http.StatusOK, 1, 1},
		{"scheme in any case", "bearer scraper-token", http.StatusOK, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if got := f.get(tc.authorization); got != tc.want {
				t.Errorf("status %d, want %d", got, tc.want)
			}
			if f.tokens.reviews != tc.tokenReviews || f.access.reviews != tc.accessReviews {
				t.Errorf("%d token reviews and %d access reviews, want %d and %d", f.tokens.reviews, f.access.reviews, tc.tokenReviews, tc.accessReviews)
			}
			if tc.want == http.StatusOK && f.header != "" {
				t.Errorf("the handler saw the Authorization header %q", f.header)
			}
		})
	}
}

func TestAccessReviewSpec(t *testing.T) {
	f := newFixture(t)
	if got := f.get("Bearer scraper-token"); got != http.StatusOK {
		t.Fatalf("status %d", got)
	}
	if got := f.get("Bearer member-token"); got != http.StatusOK {
		t.Fatalf("status %d", got)
	}
	spec := f.access.specs[0]
	if spec.User != "system:serviceaccount:monitoring:scraper" || spec.UID != "u1" {
		t.Errorf("user %q uid %q", spec.User, spec.UID)
	}
	if want := []string{"system:serviceaccounts", "system:authenticated"}; !equal(spec.Groups, want) {
		t.Errorf("groups %v, want %v", spec.Groups, want)
	}
	if !equal(spec.Extra["k"], []string{"v"}) {
		t.Errorf("extra %v", spec.Extra)
	}
	if spec.ResourceAttributes != nil || spec.NonResourceAttributes == nil ||
		*spec.NonResourceAttributes != (authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}) {
		t.Errorf("attributes %v %v", spec.ResourceAttributes, spec.NonResourceAttributes)
	}
	// A user already in system:authenticated is not added to it again.
	if want := []string{"system:authenticated"}; !equal(f.access.specs[1].Groups, want) {
		t.Errorf("groups %v, want %v", f.access.specs[1].Groups, want)
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCaches(t *testing.T) {
	f := newFixture(t)
	for range 3 {
		f.get("Bearer scraper-token")
		f.get("Bearer stranger-token")
		f.get("Bearer forged")
	}
	if f.tokens.reviews != 3 || f.access.reviews != 2 {
		t.Fatalf("%d token reviews and %d access reviews, want 3 and 2: answers are reused", f.tokens.reviews, f.access.reviews)
	}
	// After a minute the tokens are reviewed again, and the denial, but
	// not the allowance (5 minutes).
	f.now = f.now.Add(TokenCacheTTL)
	f.get("Bearer scraper-token")
	f.get("Bearer stranger-token")
	f.get("Bearer forged")
	if f.tokens.reviews != 6 || f.access.reviews != 3 {
		t.Fatalf("after %s: %d token reviews and %d access reviews, want 6 and 3", TokenCacheTTL, f.tokens.reviews, f.access.reviews)
	}
	f.now = f.now.Add(AllowCacheTTL)
	f.get("Bearer scraper-token")
	if f.access.reviews != 4 {
		t.Fatalf("after %s: %d access reviews, want 4", AllowCacheTTL, f.access.reviews)
	}
}

func TestFailures(t *testing.T) {
	transient := apierrors.NewInternalError(errors.New("etcd"))
	t.Run("transient errors are retried", func(t *testing.T) {
		f := newFixture(t)
		f.tokens.errs = []error{transient, apierrors.NewTooManyRequests("slow down", 0)}
		f.access.errs = []error{apierrors.NewTimeoutError("slow", 0)}
		if got := f.get("Bearer scraper-token"); got != http.StatusOK {
			t.Fatalf("status %d, want 200", got)
		}
		if f.tokens.reviews != 3 || f.access.reviews != 2 {
			t.Fatalf("%d token reviews and %d access reviews, want 3 and 2", f.tokens.reviews, f.access.reviews)
		}
	})
	t.Run("retries end", func(t *testing.T) {
		f := newFixture(t)
		f.tokens.errs = []error{transient, transient, transient, transient}
		if got := f.get("Bearer scraper-token"); got != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", got)
		}
		if f.tokens.reviews != 3 {
			t.Fatalf("%d token reviews, want 3", f.tokens.reviews)
		}
	})
	t.Run("other errors are not retried nor cached", func(t *testing.T) {
		f := newFixture(t)
		f.tokens.errs = []error{apierrors.NewForbidden(authenticationv1.Resource("tokenreviews"), "", errors.New("no"))}
		if got := f.get("Bearer scraper-token"); got != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", got)
		}
		f.access.errs = []error{apierrors.NewForbidden(authorizationv1.Resource("subjectaccessreviews"), "", errors.New("no"))}
		if got := f.get("Bearer scraper-token"); got != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", got)
		}
		if got := f.get("Bearer scraper-token"); got != http.StatusOK {
			t.Fatalf("status %d, want 200", got)
		}
		if f.tokens.reviews != 2 || f.access.reviews != 2 {
			t.Fatalf("%d token reviews and %d access reviews, want 2 and 2", f.tokens.reviews, f.access.reviews)
		}
	})
	t.Run("a review's error is not cached", func(t *testing.T) {
		f := newFixture(t)
		f.tokens.status = "the token's signature does not verify"
		f.get("Bearer forged")
		f.get("Bearer forged")
		if f.tokens.reviews != 2 {
			t.Fatalf("%d token reviews, want 2", f.tokens.reviews)
		}
	})
	t.Run("allowed and denied at once", func(t *testing.T) {
		f := newFixture(t)
		f.access.both = true
		if got := f.get("Bearer scraper-token"); got != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", got)
		}
	})
}

func TestCacheSweep(t *testing.T) {
	c := newTTLCache[int]()
	now := time.Unix(0, 0)
	for i := range sweepAt {
		c.add(string(rune('a'+i)), i, now, time.Second)
	}
	c.add("fresh", 1, now.Add(time.Second), time.Second)
	if len(c.entries) != 1 {
		t.Fatalf("%d entries after the sweep, want 1", len(c.entries))
	}
	if v, ok := c.get("fresh", now.Add(time.Second)); !ok || v != 1 {
		t.Fatalf("fresh: %d, %v", v, ok)
	}
	if _, ok := c.get("fresh", now.Add(2*time.Second)); ok {
		t.Fatal("an expired entry was returned")
	}
}
