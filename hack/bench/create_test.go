package main

import (
	"context"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
)

// TestCreateRetrying checks the bench's creation against the API server:
// it returns the object created, and an object that already existed before
// its first try is an error (only a try of its own that lost its answer
// makes an existing object the answer).
func TestCreateRetrying(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	cs, err := kubernetes.NewForConfig(env().Config)
	g.Expect(err).NotTo(HaveOccurred())
	configMaps := cs.CoreV1().ConfigMaps(ns)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "created", Labels: map[string]string{"a": "b"}}}
	got, err := createRetrying(ctx, configMaps, cm, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.UID).NotTo(BeEmpty())
	g.Expect(got.Labels).To(HaveKeyWithValue("a", "b"))
	_, err = createRetrying(ctx, configMaps, cm, metav1.CreateOptions{})
	g.Expect(apierrors.IsAlreadyExists(err)).To(BeTrue(), "got %v", err)
}

// TestTransientError checks which answers a creation is tried again on.
func TestTransientError(t *testing.T) {
	g := NewWithT(t)
	cms := schema.GroupResource{Resource: "configmaps"}
	g.Expect(transientError(apierrors.NewInternalError(errors.New("resource quota evaluation timed out")))).To(BeTrue())
	g.Expect(transientError(apierrors.NewServerTimeout(cms, "create", 1))).To(BeTrue())
	g.Expect(transientError(apierrors.NewTimeoutError("timed out", 1))).To(BeTrue())
	g.Expect(transientError(apierrors.NewTooManyRequests("slow down", 1))).To(BeTrue())
	g.Expect(transientError(apierrors.NewServiceUnavailable("starting"))).To(BeTrue())
	g.Expect(transientError(apierrors.NewAlreadyExists(cms, "x"))).To(BeFalse())
	g.Expect(transientError(apierrors.NewForbidden(cms, "x", errors.New("no")))).To(BeFalse())
	g.Expect(transientError(apierrors.NewBadRequest("no"))).To(BeFalse())
}
