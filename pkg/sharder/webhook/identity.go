package webhook

import (
	"context"
	"errors"
	"fmt"
	"sync"

	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// identity is the sharder's user name, configured or asked of the API
// server once (a SelfSubjectReview of the manager's credentials). A failed
// lookup is retried on the next call.
type identity struct {
	client client.Client

	mu   sync.Mutex
	name string
}

func (i *identity) get(ctx context.Context) (string, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.name != "" {
		return i.name, nil
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := i.client.Create(ctx, review); err != nil {
		return "", fmt.Errorf("asking the API server who the sharder is (SelfSubjectReview): %w", err)
	}
	if review.Status.UserInfo.Username == "" {
		return "", errors.New("the API server returned no user name for the sharder (SelfSubjectReview)")
	}
	i.name = review.Status.UserInfo.Username
	return i.name, nil
}
