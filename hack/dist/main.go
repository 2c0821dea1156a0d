// Command dist packs the sharder CLI of a release for its users and writes the
// release's notes: what make dist and the release workflow
// (.github/workflows/release.yaml) run.
//
// archive packs one binary per platform, each with the LICENSE, as
// sharder_<version>_<os>_<arch>.tar.gz (a .zip for Windows), writes
// SHA256SUMS over the archives (`sha256sum -c SHA256SUMS` checks them), and,
// given a template, the krew manifest that installs the binary as
// `kubectl sharder`:
//
//	dist archive --version v0.1.0 --out bin/dist --license LICENSE \
//	  --krew hack/dist/krew.yaml.tmpl \
//	  --binary linux/amd64=bin/dist/build/linux-amd64/sharder \
//	  --binary windows/amd64=bin/dist/build/windows-amd64/sharder.exe
//
// Archives hold fixed modes, owners and times, so the same binaries always
// give the same archives and checksums.
//
// notes prints the CHANGELOG section of a version, for the release's page; it
// fails when there is none, so that no release goes out without its entry:
//
//	dist notes --version v0.1.0 CHANGELOG.md
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

const usage = "usage: dist archive [flags] | dist notes --version V CHANGELOG"

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("%s", usage))
	}
	var err error
	switch os.Args[1] {
	case "archive":
		err = archiveCommand(os.Args[2:])
	case "notes":
		err = notesCommand(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q; %s", os.Args[1], usage)
	}
	if err != nil {
		fail(err)
	}
}

// binaryFlags collects --binary os/arch=path.
type binaryFlags []Binary

func (b *binaryFlags) String() string { return fmt.Sprint(*b) }

func (b *binaryFlags) Set(s string) error {
	platform, path, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q: want os/arch=path", s)
	}
	goos, goarch, ok := strings.Cut(platform, "/")
	if !ok || goos == "" || goarch == "" || path == "" {
		return fmt.Errorf("%q: want os/arch=path", s)
	}
	*b = append(*b, Binary{OS: goos, Arch: goarch, Path: path})
	return nil
}

func archiveCommand(args []string) error {
	fs := flag.NewFlagSet("dist archive", flag.ExitOnError)
	var o Options
	var binaries binaryFlags
	fs.StringVar(&o.Version, "version", "", "the release's version, vX.Y.Z (required)")
	fs.StringVar(&o.Out, "out", "", "the folder the archives, SHA256SUMS and the krew manifest go to (required)")
	fs.StringVar(&o.License, "license", "LICENSE", "the license file every archive carries")
	fs.StringVar(&o.KrewTemplate, "krew", "", "the krew manifest's template (none: no manifest)")
	fs.Var(&binaries, "binary", "os/arch=path of one platform's binary (repeated)")
	_ = fs.Parse(args)
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q; %s", fs.Args(), usage)
	}
	o.Binaries = binaries
	archives, err := Archive(o)
	if err != nil {
		return err
	}
	for _, a := range archives {
		fmt.Printf("%s  %s\n", a.SHA256, a.Name)
	}
	return nil
}

func notesCommand(args []string) error {
	fs := flag.NewFlagSet("dist notes", flag.ExitOnError)
	version := fs.String("version", "", "the release's version, vX.Y.Z (required)")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("want the changelog's path; %s", usage)
	}
	changelog, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	notes, err := Notes(string(changelog), *version)
	if err != nil {
		return err
	}
	fmt.Print(notes)
	return nil
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "dist: %v\n", err)
	os.Exit(1)
}
