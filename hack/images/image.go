package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
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

// Spec describes an image of one program, for one or more platforms.
type Spec struct {
	// Binaries are the program built for each platform the image is for.
	// Each must be a statically linked ELF executable for its platform's
	// architecture: the image has no libc. At least one is required, at most
	// one per platform.
	Binaries []Binary
	// Path is the binary's absolute path in the image and the entrypoint.
	// Required.
	Path string
	// Ref is the image reference written into the tarball and the layout,
	// with a tag. Required.
	Ref string
	// User is the user[:group] the image runs as. Default (empty): root.
	User string
	// Cmd is the default arguments. Default: none.
	Cmd []string
	// Labels are added to the default labels (title, source, version).
	Labels map[string]string
	// Layers are more layers, in order, above the binary's, the same in
	// every platform's image. Default: none.
	Layers []Layer
	// Entrypoint is the image's entrypoint. Default: Path alone.
	Entrypoint []string
}

// Layer is one more layer of an image: files copied into it.
type Layer struct {
	Files []LayerFile
}

// LayerFile is a file of a Layer.
type LayerFile struct {
	// Path is the file's absolute path in the image.
	Path string
	// Source is the file to copy. Its mode in the image is 0755 if it is
	// executable by anyone, else 0644; the file's owner is root.
	Source string
}

// Binary is the program built for one platform.
type Binary struct {
	// Platform is the platform the binary runs on; its OS must be linux.
	Platform v1.Platform
	// File is the executable.
	File string
}

// PlatformImage is a Spec's image for one platform.
type PlatformImage struct {
	Platform v1.Platform
	Image    v1.Image
}

// layerKind says how an image's layer is stored: the tarball keeps it
// uncompressed, as before; the layout, which is pushed, compresses it. Both
// have the same uncompressed content, hence the same config and image ID.
type layerKind int

const (
	uncompressed layerKind = iota
	gzipped
)

// Build returns the images Spec describes, one per binary, in the order of
// Spec.Binaries, with uncompressed layers.
func Build(spec Spec) ([]PlatformImage, name.Tag, error) {
	return build(spec, uncompressed)
}

func build(spec Spec, kind layerKind) ([]PlatformImage, name.Tag, error) {
	switch {
	case len(spec.Binaries) == 0:
		return nil, name.Tag{}, errors.New("no binary given")
	case !path.IsAbs(spec.Path) || strings.HasSuffix(spec.Path, "/"):
		return nil, name.Tag{}, fmt.Errorf("path in the image %q: want an absolute file path", spec.Path)
	}
	tag, err := name.NewTag(spec.Ref, name.StrictValidation)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("image reference %q (a tag is required): %w", spec.Ref, err)
	}
	for _, l := range spec.Layers {
		if len(l.Files) == 0 {
			return nil, name.Tag{}, errors.New("a layer without files")
		}
		for _, f := range l.Files {
			if !path.IsAbs(f.Path) || strings.HasSuffix(f.Path, "/") {
				return nil, name.Tag{}, fmt.Errorf("path in the image %q: want an absolute file path", f.Path)
			}
		}
	}
	seen := map[string]bool{}
	images := make([]PlatformImage, 0, len(spec.Binaries))
	for _, b := range spec.Binaries {
		if seen[b.Platform.String()] {
			return nil, name.Tag{}, fmt.Errorf("two binaries for %s", b.Platform.String())
		}
		seen[b.Platform.String()] = true
		img, err := buildOne(spec, tag, b, kind)
		if err != nil {
			return nil, name.Tag{}, fmt.Errorf("%s: %w", b.Platform.String(), err)
		}
		images = append(images, PlatformImage{Platform: b.Platform, Image: img})
	}
	return images, tag, nil
}

func buildOne(spec Spec, tag name.Tag, b Binary, kind layerKind) (v1.Image, error) {
	if b.File == "" {
		return nil, errors.New("no binary given")
	}
	if err := checkExecutable(b.File, b.Platform); err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(b.File)
	if err != nil {
		return nil, err
	}
	fs, err := rootFS(spec.Path, bin)
	if err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	layer, err := newLayer(fs, kind)
	if err != nil {
		return nil, err
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "hack/images: " + path.Base(spec.Path),
		},
	})
	if err != nil {
		return nil, err
	}
	for _, l := range spec.Layers {
		if img, err = appendLayer(img, l, kind); err != nil {
			return nil, err
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture = b.Platform.Architecture
	cfg.Variant = b.Platform.Variant
	cfg.OS = b.Platform.OS
	cfg.Created = v1.Time{Time: epoch}
	entrypoint := spec.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = []string{spec.Path}
	}
	cfg.Config = v1.Config{
		Entrypoint: entrypoint,
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
	return mutate.ConfigFile(img, cfg)
}

// appendLayer adds the files of l to img as one layer.
func appendLayer(img v1.Image, l Layer, kind layerKind) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	w := newTreeWriter(tw)
	var names []string
	for _, f := range l.Files {
		info, err := os.Stat(f.Source)
		if err != nil {
			return nil, err
		}
		if !info.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: not a regular file", f.Source)
		}
		content, err := os.ReadFile(f.Source)
		if err != nil {
			return nil, err
		}
		mode := int64(0o644)
		if info.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
		if err := w.file(strings.TrimPrefix(f.Path, "/"), mode, content); err != nil {
			return nil, fmt.Errorf("writing the layer: %w", err)
		}
		names = append(names, path.Base(f.Path))
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := newLayer(buf.Bytes(), kind)
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "hack/images: " + strings.Join(names, " "),
		},
	})
}

// newLayer returns the layer of the root file system fs, stored as kind
// says. gzip's output depends on the input and the Go release alone, so a
// compressed layer is as reproducible as the uncompressed one.
func newLayer(fs []byte, kind layerKind) (v1.Layer, error) {
	if kind == uncompressed {
		return static.NewLayer(fs, types.OCIUncompressedLayer), nil
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(fs); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	gz := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// WriteTarball writes the image for platform to output as an image tarball
// (the `docker save` layout, one platform), unless output already holds the
// same image under the same reference. It reports whether it wrote.
func WriteTarball(spec Spec, platform v1.Platform, output string) (bool, error) {
	var one []Binary
	for _, b := range spec.Binaries {
		if b.Platform.Equals(platform) {
			one = append(one, b)
		}
	}
	if len(one) == 0 {
		return false, fmt.Errorf("%s: the tarball holds the image for %s, and no binary is given for it", spec.Ref, platform.String())
	}
	spec.Binaries = one
	images, tag, err := Build(spec)
	if err != nil {
		return false, fmt.Errorf("%s: %w", spec.Ref, err)
	}
	img := images[0].Image
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

// machines are the ELF machines of the architectures Go builds Linux
// binaries for.
var machines = map[string]elf.Machine{
	"386":      elf.EM_386,
	"amd64":    elf.EM_X86_64,
	"arm":      elf.EM_ARM,
	"arm64":    elf.EM_AARCH64,
	"loong64":  elf.EM_LOONGARCH,
	"ppc64le":  elf.EM_PPC64,
	"riscv64":  elf.EM_RISCV,
	"s390x":    elf.EM_S390,
	"mips64le": elf.EM_MIPS,
}

// checkExecutable fails unless file is an ELF executable for platform that
// needs no dynamic loader: a binary of the host's when the host is not
// Linux, or of another architecture, would not start, and neither would a
// cgo build in an image without libc.
func checkExecutable(file string, platform v1.Platform) error {
	if platform.OS != "linux" {
		return fmt.Errorf("platform %s: the images are Linux images", platform.String())
	}
	want, ok := machines[platform.Architecture]
	if !ok {
		return fmt.Errorf("platform %s: unknown architecture", platform.String())
	}
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("%s: not a Linux executable (build it with GOOS=linux): %w", file, err)
	}
	defer func() { _ = f.Close() }()
	if f.Machine != want {
		return fmt.Errorf("%s is built for %s, not %s (build it with GOARCH=%s)", file, f.Machine, platform.Architecture, platform.Architecture)
	}
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
	w := newTreeWriter(tw)
	dir, file := w.dir, w.file
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

// treeWriter writes folders and files into a layer, every entry with fixed
// times, each folder once.
type treeWriter struct {
	tw   *tar.Writer
	dirs map[string]bool
}

func newTreeWriter(tw *tar.Writer) *treeWriter {
	return &treeWriter{tw: tw, dirs: map[string]bool{}}
}

func (w *treeWriter) dir(p string, mode int64, uid int) error {
	if w.dirs[p] {
		return nil
	}
	w.dirs[p] = true
	return w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode, Uid: uid, Gid: uid, ModTime: epoch, Format: tar.FormatPAX})
}

// file writes a root-owned file, after its parent folders (root-owned, in
// order) unless written already.
func (w *treeWriter) file(p string, mode int64, content []byte) error {
	parts := strings.Split(path.Dir(p), "/")
	for i := range parts {
		if parent := strings.Join(parts[:i+1], "/"); parent != "" {
			if err := w.dir(parent, 0o755, 0); err != nil {
				return err
			}
		}
	}
	if err := w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(content)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := w.tw.Write(content)
	return err
}
