package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// refAnnotation names the image in an OCI layout's index.json.
const refAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout writes the images of spec to dir as an OCI image layout whose
// index.json has one entry: an image index, annotated with spec.Ref, that
// lists every platform's image. Their layers are gzip-compressed, as a
// registry serves them. An existing layout that holds the same images (the
// same image IDs for the same platforms) under the same reference is left
// untouched; WriteLayout reports whether it wrote.
func WriteLayout(spec Spec, dir string) (bool, error) {
	// The image IDs do not depend on the layers' compression: compare
	// before compressing anything.
	images, tag, err := Build(spec)
	if err != nil {
		return false, fmt.Errorf("%s: %w", spec.Ref, err)
	}
	want := map[string]v1.Hash{}
	for _, pi := range images {
		id, err := pi.Image.ConfigName()
		if err != nil {
			return false, err
		}
		want[pi.Platform.String()] = id
	}
	if have, err := layoutIDs(dir, tag); err == nil && sameIDs(have, want) {
		return false, nil
	}

	images, _, err = build(spec, gzipped)
	if err != nil {
		return false, fmt.Errorf("%s: %w", spec.Ref, err)
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, pi := range images {
		platform := pi.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        pi.Image,
			Descriptor: v1.Descriptor{Platform: &platform},
		})
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o750); err != nil {
		return false, err
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return false, err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return false, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refAnnotation: tag.String()})); err != nil {
		_ = os.RemoveAll(tmp)
		return false, fmt.Errorf("writing %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, dir)
}

// ReadLayout returns the image index of a layout WriteLayout wrote, and the
// reference it was written under.
func ReadLayout(dir string) (v1.ImageIndex, name.Tag, error) {
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("reading the OCI layout %s: %w", dir, err)
	}
	m, err := root.IndexManifest()
	if err != nil {
		return nil, name.Tag{}, err
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, name.Tag{}, fmt.Errorf("%s: want one image index in index.json, found %d entries", dir, len(m.Manifests))
	}
	desc := m.Manifests[0]
	tag, err := name.NewTag(desc.Annotations[refAnnotation], name.StrictValidation)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("%s: the index's %s: %w", dir, refAnnotation, err)
	}
	idx, err := root.ImageIndex(desc.Digest)
	if err != nil {
		return nil, name.Tag{}, err
	}
	return idx, tag, nil
}

// layoutIDs returns the image ID of each platform in the layout at dir,
// which must be written under tag.
func layoutIDs(dir string, tag name.Tag) (map[string]v1.Hash, error) {
	idx, have, err := ReadLayout(dir)
	if err != nil {
		return nil, err
	}
	if have.String() != tag.String() {
		return nil, errors.New("another reference")
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	ids := map[string]v1.Hash{}
	for _, desc := range m.Manifests {
		if desc.Platform == nil {
			return nil, errors.New("an image without a platform")
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, err
		}
		if ids[desc.Platform.String()], err = img.ConfigName(); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

func sameIDs(a, b map[string]v1.Hash) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
