// Command images packs static binaries into OCI images and pushes them to a
// registry, with go-containerregistry alone: no container engine, base image
// or registry client is involved.
//
// pack writes one image, for one or more platforms, as an image tarball (the
// `docker save` layout, the host's platform only), which `ctr images import`,
// `docker load`, `podman load` and `kind load image-archive` accept, and as an
// OCI image layout holding one multi-platform image index:
//
//	images pack --binary linux/amd64=bin/images/linux-amd64/sharder \
//	  --binary linux/arm64=bin/images/linux-arm64/sharder --path /sharder --cmd run \
//	  --ref ghcr.io/sharder-dev/sharder:0.1.0 \
//	  --output bin/images/sharder.tar --layout bin/images/oci/sharder
//
// Each image has a layer holding the binary, /etc/passwd and /etc/group
// (root and nonroot, 65532), /tmp and the nonroot user's home, and one more
// layer per --layer with the files it names (the shell controller's image
// adds kubectl and its script to busybox this way); uncompressed in the
// tarball, gzip-compressed in the layout. Content and timestamps are
// fixed, so the same binary always gives the same image ID; an existing output
// with the same IDs is left untouched.
//
// push sends the image index of one or more layouts to a registry, under the
// registry's path with the image's own name (…/sharder):
//
//	images push --registry registry.example.com/team --tag 0.1.0 bin/images/oci/sharder
//
// Credentials come from the Docker config (~/.docker/config.json); --insecure
// (or IMAGES_INSECURE=true) speaks plain HTTP to the registry.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

const usage = "usage: images pack [flags] | images push [flags] LAYOUT..."

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("%s", usage))
	}
	var err error
	switch os.Args[1] {
	case "pack":
		err = pack(os.Args[2:])
	case "push":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		err = push(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q; %s", os.Args[1], usage)
	}
	if err != nil {
		fail(err)
	}
}

// hostPlatform is the platform of the tarball: Linux on the machine's
// architecture, whichever OS the machine runs.
func hostPlatform() v1.Platform {
	return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
}

func pack(args []string) error {
	// A flag set of its own, so that no imported package adds flags to it.
	fs := flag.NewFlagSet("images pack", flag.ExitOnError)
	var spec Spec
	fs.Func("binary", "PLATFORM=FILE: the static binary for a platform (os/arch, e.g. linux/arm64); a FILE alone is for "+hostPlatform().String()+" (one at least; repeatable)", func(v string) error {
		p, file, ok := strings.Cut(v, "=")
		platform := hostPlatform()
		if !ok {
			file = p
		} else {
			parsed, err := v1.ParsePlatform(p)
			if err != nil {
				return err
			}
			platform = *parsed
		}
		spec.Binaries = append(spec.Binaries, Binary{Platform: platform, File: file})
		return nil
	})
	fs.StringVar(&spec.Path, "path", "", "where the binary goes in the image, also the entrypoint (required)")
	fs.StringVar(&spec.Ref, "ref", "", "image reference, e.g. ghcr.io/sharder-dev/sharder:0.1.0 (required)")
	fs.StringVar(&spec.User, "user", NonRootUser, "user[:group] the image runs as; empty for root")
	cmd := fs.String("cmd", "", "comma-separated default arguments (the image's CMD)")
	entrypoint := fs.String("entrypoint", "", "comma-separated entrypoint (default: --path)")
	fs.Func("layer", "PATH=FILE[,PATH=FILE...]: one more layer, above the binary's, with each FILE at PATH in the image, in every platform's image (repeatable: a layer each, in order)", func(v string) error {
		var l Layer
		for _, entry := range strings.Split(v, ",") {
			p, file, ok := strings.Cut(entry, "=")
			if !ok || p == "" || file == "" {
				return fmt.Errorf("layer entry %q: want PATH=FILE", entry)
			}
			l.Files = append(l.Files, LayerFile{Path: p, Source: file})
		}
		spec.Layers = append(spec.Layers, l)
		return nil
	})
	labels := fs.String("labels", "", "comma-separated key=value image labels, added to the defaults")
	output := fs.String("output", "", "the image tarball to write, with the image for "+hostPlatform().String())
	dir := fs.String("layout", "", "the OCI image layout to write, with every platform's image")
	_ = fs.Parse(args)

	if *cmd != "" {
		spec.Cmd = strings.Split(*cmd, ",")
	}
	if *entrypoint != "" {
		spec.Entrypoint = strings.Split(*entrypoint, ",")
	}
	if *labels != "" {
		spec.Labels = map[string]string{}
		for _, kv := range strings.Split(*labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("label %q: want key=value", kv)
			}
			spec.Labels[k] = v
		}
	}
	if *output == "" && *dir == "" {
		return fmt.Errorf("--output, --layout or both are required")
	}
	if *output != "" {
		written, err := WriteTarball(spec, hostPlatform(), *output)
		if err != nil {
			return err
		}
		if written {
			fmt.Printf("%s: %s (%s)\n", *output, spec.Ref, hostPlatform().String())
		}
	}
	if *dir != "" {
		written, err := WriteLayout(spec, *dir)
		if err != nil {
			return err
		}
		if written {
			var platforms []string
			for _, b := range spec.Binaries {
				platforms = append(platforms, b.Platform.String())
			}
			fmt.Printf("%s: %s (%s)\n", *dir, spec.Ref, strings.Join(platforms, ", "))
		}
	}
	return nil
}

func push(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("images push", flag.ExitOnError)
	var o PushOptions
	fs.StringVar(&o.Registry, "registry", "", "registry host and optional path the images go under, e.g. registry.example.com/team (required)")
	fs.StringVar(&o.Tag, "tag", "", "the pushed images' tag (default: each layout's own)")
	insecure, _ := strconv.ParseBool(os.Getenv("IMAGES_INSECURE"))
	fs.BoolVar(&o.Insecure, "insecure", insecure, "speak plain HTTP to the registry (default from IMAGES_INSECURE)")
	_ = fs.Parse(args)
	if fs.NArg() == 0 {
		return fmt.Errorf("no layout given; %s", usage)
	}
	for _, dir := range fs.Args() {
		pushed, err := Push(ctx, dir, o)
		if err != nil {
			return err
		}
		fmt.Println(pushed.String())
	}
	return nil
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "images: %v\n", err)
	os.Exit(1)
}
