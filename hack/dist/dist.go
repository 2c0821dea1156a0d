package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"
)

// Binary is one platform's build of the CLI.
type Binary struct {
	OS, Arch string
	// Path is the built binary (sharder, or sharder.exe for Windows).
	Path string
}

// Options says what Archive packs and where it writes.
type Options struct {
	// Version is the release's version, vX.Y.Z with an optional
	// pre-release; archive names carry it without the v.
	Version string
	// Out is the folder the archives, SHA256SUMS and the krew manifest go
	// to. It is created; archives of other versions in it are left alone.
	Out string
	// License is the license file every archive carries.
	License string
	// KrewTemplate is the krew manifest's template (text/template over
	// krewData); empty: no manifest.
	KrewTemplate string
	Binaries     []Binary
}

// Archived is one archive written.
type Archived struct {
	OS, Arch string
	// Name is the archive's file name in Out.
	Name string
	// SHA256 is the archive's checksum, hex.
	SHA256 string
	// Bin is the binary's name inside the archive.
	Bin string
}

// KrewManifest is the krew manifest's file name in Out.
const KrewManifest = "sharder.krew.yaml"

// Checksums is the checksum file's name in Out.
const Checksums = "SHA256SUMS"

// releaseVersion is a release tag: v, then a semantic version without build
// metadata (a tag names a release; build metadata would not make it another).
var releaseVersion = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// fixedTime is every archive entry's modification time: archives depend on
// their content only.
var fixedTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Archive packs each binary with the license into an archive named after the
// version and platform, writes SHA256SUMS over them and, with a template, the
// krew manifest. It returns the archives in the order of their names.
func Archive(o Options) ([]Archived, error) {
	if !releaseVersion.MatchString(o.Version) {
		return nil, fmt.Errorf("version %q: want a release tag, vX.Y.Z with an optional -pre-release", o.Version)
	}
	if o.Out == "" {
		return nil, errors.New("no output folder given")
	}
	if len(o.Binaries) == 0 {
		return nil, errors.New("no binary given")
	}
	license, err := os.ReadFile(o.License)
	if err != nil {
		return nil, fmt.Errorf("reading the license: %w", err)
	}
	if err := os.MkdirAll(o.Out, 0o750); err != nil {
		return nil, err
	}
	version := strings.TrimPrefix(o.Version, "v")
	seen := map[string]bool{}
	archives := make([]Archived, 0, len(o.Binaries))
	for _, b := range o.Binaries {
		platform := b.OS + "/" + b.Arch
		if seen[platform] {
			return nil, fmt.Errorf("two binaries for %s", platform)
		}
		seen[platform] = true
		a, err := archiveOne(o.Out, version, b, license)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", platform, err)
		}
		archives = append(archives, a)
	}
	slices.SortFunc(archives, func(a, b Archived) int { return strings.Compare(a.Name, b.Name) })

	var sums strings.Builder
	for _, a := range archives {
		fmt.Fprintf(&sums, "%s  %s\n", a.SHA256, a.Name)
	}
	if err := os.WriteFile(filepath.Join(o.Out, Checksums), []byte(sums.String()), 0o600); err != nil {
		return nil, err
	}
	if o.KrewTemplate != "" {
		if err := writeKrew(o.KrewTemplate, filepath.Join(o.Out, KrewManifest), o.Version, archives); err != nil {
			return nil, err
		}
	}
	return archives, nil
}

// archiveOne writes b's archive into out.
func archiveOne(out, version string, b Binary, license []byte) (Archived, error) {
	binary, err := os.ReadFile(b.Path)
	if err != nil {
		return Archived{}, err
	}
	a := Archived{OS: b.OS, Arch: b.Arch, Bin: "sharder"}
	var buf bytes.Buffer
	if b.OS == "windows" {
		a.Bin += ".exe"
		a.Name = fmt.Sprintf("sharder_%s_%s_%s.zip", version, b.OS, b.Arch)
		err = writeZip(&buf, []entry{{a.Bin, binary, 0o755}, {"LICENSE", license, 0o644}})
	} else {
		a.Name = fmt.Sprintf("sharder_%s_%s_%s.tar.gz", version, b.OS, b.Arch)
		err = writeTarGz(&buf, []entry{{a.Bin, binary, 0o755}, {"LICENSE", license, 0o644}})
	}
	if err != nil {
		return Archived{}, err
	}
	sum := sha256.Sum256(buf.Bytes())
	a.SHA256 = hex.EncodeToString(sum[:])
	return a, os.WriteFile(filepath.Join(out, a.Name), buf.Bytes(), 0o600)
}

type entry struct {
	name string
	data []byte
	mode os.FileMode
}

func writeTarGz(w io.Writer, entries []entry) error {
	gz, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		hdr := &tar.Header{
			Typeflag: tar.TypeReg, Name: e.name, Size: int64(len(e.data)), Mode: int64(e.mode),
			ModTime: fixedTime, Uname: "root", Gname: "root", Format: tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

func writeZip(w io.Writer, entries []entry) error {
	zw := zip.NewWriter(w)
	for _, e := range entries {
		hdr := &zip.FileHeader{Name: e.name, Method: zip.Deflate, Modified: fixedTime}
		hdr.SetMode(e.mode)
		f, err := zw.CreateHeader(hdr)
		if err != nil {
			return err
		}
		if _, err := f.Write(e.data); err != nil {
			return err
		}
	}
	return zw.Close()
}

// krewData is what the krew manifest's template sees.
type krewData struct {
	// Version is the release's tag, vX.Y.Z (krew wants the v).
	Version   string
	Platforms []Archived
}

func writeKrew(templatePath, out, version string, archives []Archived) error {
	text, err := os.ReadFile(templatePath)
	if err != nil {
		return err
	}
	tmpl, err := template.New(filepath.Base(templatePath)).Option("missingkey=error").Parse(string(text))
	if err != nil {
		return fmt.Errorf("krew template: %w", err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, krewData{Version: version, Platforms: archives}); err != nil {
		return fmt.Errorf("krew template: %w", err)
	}
	return os.WriteFile(out, buf.Bytes(), 0o600)
}

// Notes returns the section of changelog (Keep a Changelog: `## [X.Y.Z] -
// date` headings) of version, vX.Y.Z, without its heading; an error when
// there is none or it is empty.
func Notes(changelog, version string) (string, error) {
	if !releaseVersion.MatchString(version) {
		return "", fmt.Errorf("version %q: want a release tag, vX.Y.Z with an optional -pre-release", version)
	}
	heading := "## [" + strings.TrimPrefix(version, "v") + "]"
	var section []string
	in := false
	for line := range strings.Lines(changelog) {
		switch {
		case strings.HasPrefix(line, heading):
			in = true
			continue
		case in && (strings.HasPrefix(line, "## ") || isLinkReference(line)):
			in = false
		}
		if in {
			section = append(section, line)
		}
	}
	notes := strings.TrimSpace(strings.Join(section, ""))
	if notes == "" {
		return "", fmt.Errorf("the changelog has no entry for %s (a heading %q with the release's changes): write it before tagging (docs/releasing.md)", version, heading+" - YYYY-MM-DD")
	}
	return notes + "\n", nil
}

// isLinkReference reports whether line is one of the link definitions that
// end a Keep a Changelog file ([1.0.0]: https://...).
func isLinkReference(line string) bool {
	label, rest, ok := strings.Cut(line, "]: ")
	return ok && strings.HasPrefix(label, "[") && !strings.ContainsAny(label, " \t") && strings.HasPrefix(rest, "http")
}
