package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRootUser is the user and group the images run as unless told otherwise:
// the "nonroot" entry of their /etc/passwd, the same ID as distroless's.
const NonRootUser = "65532:65532"

// source is the image's org.opencontainers.image.source label.
const source = "https://github.com/sharder-dev/sharder"

// epoch is every timestamp in the image (file times, created), so that the
// image ID depends on the binary alone.
var epoch = time.Unix(0, 0).UTC()

const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\nnonroot:x:65532:\n"
)

// Spec describes an image of one binary.
type Spec struct {
	// Binary is the file to pack. It must be a statically linked ELF
	// executable: the image has no libc. Required.
	Binary string
	// Path is the binary's absolute path in the image and the entrypoint.
	// Required.
	Path string
	// Ref is the image reference written into the tarball, with a tag.
	// Required.
	Ref string
	// User is the user[:group] the image runs as. Default (empty): root.
	User string
	// Cmd is the default arguments. Default: none.
	Cmd []string
	// Labels are added to the default labels (title, source, version).
	Labels map[string]string
}

// Build returns the image Spec describes.
func Build(spec Spec) (v1.Image, name.Tag, error) {
	switch {
	case spec.Binary == "":
		return nil, name.Tag{}, errors.New("no binary given")
	case !path.IsAbs(spec.Path) || strings.HasSuffix(spec.Path, "/"):
		return nil, name.Tag{}, fmt.Errorf("path in the image %q: want an absolute file path", spec.Path)
	}
	tag, err := name.NewTag(spec.Ref, name.StrictValidation)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("image reference %q (a tag is required): %w", spec.Ref, err)
	}
	if err := checkStatic(spec.Binary); err != nil {
		return nil, name.Tag{}, err
	}
	bin, err := os.ReadFile(spec.Binary)
	if err != nil {
		return nil, name.Tag{}, err
	}
	layer, err := rootFS(spec.Path, bin)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("writing the layer: %w", err)
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: static.NewLayer(layer, types.OCIUncompressedLayer),
		History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "hack/images: " + path.Base(spec.Path),
		},
	})
	if err != nil {
		return nil, name.Tag{}, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, name.Tag{}, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture = runtime.GOARCH
	cfg.OS = "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config = v1.Config{
		Entrypoint: []string{spec.Path},
		Cmd:        spec.Cmd,
		User:       spec.User,
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":   path.Base(spec.Path),
			"org.opencontainers.image.source":  source,
			"org.opencontainers.image.version": tag.TagStr(),
		},
	}
	for k, v := range spec.Labels {
		cfg.Config.Labels[k] = v
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, name.Tag{}, err
	}
	return img, tag, nil
}

// Write builds the image and writes it to output, unless output already holds
// the same image under the same reference. It reports whether it wrote.
func Write(spec Spec, output string) (bool, error) {
	img, tag, err := Build(spec)
	if err != nil {
		return false, fmt.Errorf("%s: %w", spec.Ref, err)
	}
	id, err := img.ConfigName()
	if err != nil {
		return false, err
	}
	if old, err := tarball.ImageFromPath(output, &tag); err == nil {
		if oldID, err := old.ConfigName(); err == nil && oldID == id {
			return false, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(output), 0o750); err != nil {
		return false, err
	}
	tmp := output + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("writing %s: %w", output, err)
	}
	return true, os.Rename(tmp, output)
}

// checkStatic fails unless file is an ELF executable that needs no dynamic
// loader: a cgo build would not start in an image without libc.
func checkStatic(file string) error {
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("%s: not an executable: %w", file, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; build it with CGO_ENABLED=0", file)
		}
	}
	return nil
}

// rootFS returns the layer: the binary at binPath, the users and groups, /tmp
// and the nonroot user's home, every entry with fixed times.
func rootFS(binPath string, bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	dir := func(p string, mode int64, uid int) error {
		if dirs[p] {
			return nil
		}
		dirs[p] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode, Uid: uid, Gid: uid, ModTime: epoch, Format: tar.FormatPAX})
	}
	file := func(p string, mode int64, content []byte) error {
		// Parent folders first, root-owned, in order.
		parts := strings.Split(path.Dir(p), "/")
		for i := range parts {
			if parent := strings.Join(parts[:i+1], "/"); parent != "" {
				if err := dir(parent, 0o755, 0); err != nil {
					return err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(content)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(content)
		return err
	}
	steps := []func() error{
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return dir("home", 0o755, 0) },
		func() error { return dir("home/nonroot", 0o700, 65532) },
		func() error { return dir("tmp", 0o1777, 0) },
		func() error { return file(strings.TrimPrefix(binPath, "/"), 0o755, bin) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
