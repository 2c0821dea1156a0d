package controller

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// Keys of a backup's credentials Secret: the access key pair of the S3
// store, named as the AWS tools name them.
const (
	SecretKeyAccessKeyID     = "AWS_ACCESS_KEY_ID"     //nolint:gosec // the name of a key, not a credential
	SecretKeySecretAccessKey = "AWS_SECRET_ACCESS_KEY" //nolint:gosec // the name of a key, not a credential
)

// snapshotPartSize is the size of one part of a snapshot upload: the upload
// holds one part in memory, never the whole snapshot.
const snapshotPartSize = 16 << 20

// inputError is bad input (a missing Secret, an unknown bucket, an endpoint
// that is no URL): the object's condition says so with Reason, and retrying
// helps only once the input changes.
type inputError struct {
	Reason string
	err    error
}

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

func badInput(reason, format string, args ...any) *inputError {
	return &inputError{Reason: reason, err: fmt.Errorf(format, args...)}
}

// Reasons of backup and restore conditions for bad input.
const (
	ReasonStorageNotSupported = "StorageNotSupported"
	ReasonInvalidSchedule     = "InvalidSchedule"
	ReasonInvalidEndpoint     = "InvalidEndpoint"
	ReasonCredentialsNotFound = "CredentialsNotFound"
	ReasonBucketNotFound      = "BucketNotFound"
	ReasonClusterNotFound     = "ClusterNotFound"
)

// s3Store is one bucket of an S3-compatible store.
type s3Store struct {
	client *minio.Client
	bucket string
	// prefix starts every key, without a trailing slash; may be empty.
	prefix string
}

// s3Endpoint splits an endpoint URL (http://host:port or https://host) into
// minio's host and TLS switch. An empty endpoint is AWS S3.
func s3Endpoint(endpoint string) (host string, secure bool, err error) {
	if endpoint == "" {
		return "s3.amazonaws.com", true, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") {
		return "", false, fmt.Errorf("endpoint %q is not an http:// or https:// URL of a host", endpoint)
	}
	return u.Host, u.Scheme == "https", nil
}

// s3Credentials reads the access key pair from the Secret name in namespace.
func s3Credentials(ctx context.Context, reader client.Reader, namespace, name string) (*credentials.Credentials, error) {
	if name == "" {
		return nil, badInput(ReasonCredentialsNotFound, "s3.credentialsSecret is empty: it must name a Secret with %s and %s",
			SecretKeyAccessKeyID, SecretKeySecretAccessKey)
	}
	secret := &corev1.Secret{}
	if err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, badInput(ReasonCredentialsNotFound, "Secret %s/%s not found", namespace, name)
		}
		return nil, fmt.Errorf("reading Secret %s/%s: %w", namespace, name, err)
	}
	id, key := string(secret.Data[SecretKeyAccessKeyID]), string(secret.Data[SecretKeySecretAccessKey])
	if id == "" || key == "" {
		return nil, badInput(ReasonCredentialsNotFound, "Secret %s/%s lacks %s or %s", namespace, name,
			SecretKeyAccessKeyID, SecretKeySecretAccessKey)
	}
	return credentials.NewStaticV4(id, key, ""), nil
}

// openS3 opens the bucket s names, with the credentials of the Secret in
// namespace, and checks that the bucket exists.
func openS3(ctx context.Context, reader client.Reader, namespace string, s *etcdv1alpha1.EtcdS3BackupSpec) (*s3Store, error) {
	host, secure, err := s3Endpoint(s.Endpoint)
	if err != nil {
		return nil, badInput(ReasonInvalidEndpoint, "%w", err)
	}
	creds, err := s3Credentials(ctx, reader, namespace, s.CredentialsSecret)
	if err != nil {
		return nil, err
	}
	cli, err := minio.New(host, &minio.Options{Creds: creds, Secure: secure, Region: s.Region})
	if err != nil {
		return nil, badInput(ReasonInvalidEndpoint, "S3 client for %s: %w", s.Endpoint, err)
	}
	ok, err := cli.BucketExists(ctx, s.Bucket)
	if err != nil {
		if minio.ToErrorResponse(err).Code == minio.AccessDenied {
			return nil, badInput(ReasonCredentialsNotFound, "S3 store refused the credentials of Secret %s/%s: %w", namespace, s.CredentialsSecret, err)
		}
		return nil, fmt.Errorf("checking bucket %s: %w", s.Bucket, err)
	}
	if !ok {
		return nil, badInput(ReasonBucketNotFound, "bucket %q does not exist", s.Bucket)
	}
	return &s3Store{client: cli, bucket: s.Bucket, prefix: strings.Trim(s.Prefix, "/")}, nil
}

// key joins the store's prefix and the parts into an object key.
func (s *s3Store) key(parts ...string) string {
	return strings.TrimPrefix(path.Join(append([]string{s.prefix}, parts...)...), "/")
}
