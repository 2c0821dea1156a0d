package main

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// PushOptions says where Push sends an image.
type PushOptions struct {
	// Registry is the registry host and optional path under which the image
	// goes, e.g. registry.example.com/team: the image ghcr.io/sharder-dev/sharder
	// becomes registry.example.com/team/sharder. Required.
	Registry string
	// Tag is the pushed image's tag. Default: the layout's own tag.
	Tag string
	// Insecure speaks plain HTTP to the registry. Default: HTTPS, except to
	// localhost and loopback addresses, which go-containerregistry reaches
	// over HTTP anyway.
	Insecure bool
	// Remote are more options for go-containerregistry's remote package.
	// Default: credentials from the Docker config (docker login, helm
	// registry login does not share them).
	Remote []remote.Option
}

// Target returns the reference Push sends the image src to.
func (o PushOptions) Target(src name.Tag) (name.Tag, error) {
	if o.Registry == "" {
		return name.Tag{}, fmt.Errorf("no registry given")
	}
	tag := o.Tag
	if tag == "" {
		tag = src.TagStr()
	}
	var opts []name.Option
	if o.Insecure {
		opts = append(opts, name.Insecure)
	}
	ref := strings.TrimSuffix(o.Registry, "/") + "/" + path.Base(src.RepositoryStr()) + ":" + tag
	t, err := name.NewTag(ref, append(opts, name.StrictValidation)...)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image reference %q: %w", ref, err)
	}
	return t, nil
}

// Push pushes the image index of the OCI layout at dir (written by
// WriteLayout) to the registry o names, with every platform's image, and
// returns where it went.
func Push(ctx context.Context, dir string, o PushOptions) (name.Digest, error) {
	idx, src, err := ReadLayout(dir)
	if err != nil {
		return name.Digest{}, err
	}
	dst, err := o.Target(src)
	if err != nil {
		return name.Digest{}, err
	}
	opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, o.Remote...)
	if err := remote.WriteIndex(dst, idx, opts...); err != nil {
		return name.Digest{}, fmt.Errorf("pushing %s to %s: %w", src, dst, err)
	}
	digest, err := idx.Digest()
	if err != nil {
		return name.Digest{}, err
	}
	return dst.Context().Digest(digest.String()), nil
}
