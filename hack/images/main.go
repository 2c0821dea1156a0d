// Command images packs one static binary into an OCI image and writes it as an
// image tarball (the `docker save` layout), which `ctr images import`,
// `docker load`, `podman load` and `kind load image-archive` accept. No
// container engine, registry or base image is involved:
//
//	go run ./hack/images --binary bin/images/sharder --path /sharder \
//	  --ref ghcr.io/sharder-dev/sharder:0.1.0 --cmd run --output bin/images/sharder.tar
//
// The image has a single uncompressed layer holding the binary, /etc/passwd and
// /etc/group (root and nonroot, 65532), /tmp and the nonroot user's home. Its
// content and timestamps are fixed, so the same binary always gives the same
// image ID; an existing output with that ID is left untouched.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	// A flag set of its own, so that no imported package adds flags to it.
	fs := flag.NewFlagSet("images", flag.ExitOnError)
	var spec Spec
	fs.StringVar(&spec.Binary, "binary", "", "the static binary to pack (required)")
	fs.StringVar(&spec.Path, "path", "", "where the binary goes in the image, also the entrypoint (required)")
	fs.StringVar(&spec.Ref, "ref", "", "image reference, e.g. ghcr.io/sharder-dev/sharder:0.1.0 (required)")
	fs.StringVar(&spec.User, "user", NonRootUser, "user[:group] the image runs as; empty for root")
	cmd := fs.String("cmd", "", "comma-separated default arguments (the image's CMD)")
	labels := fs.String("labels", "", "comma-separated key=value image labels, added to the defaults")
	output := fs.String("output", "", "the tarball to write (required)")
	_ = fs.Parse(os.Args[1:])

	if *cmd != "" {
		spec.Cmd = strings.Split(*cmd, ",")
	}
	if *labels != "" {
		spec.Labels = map[string]string{}
		for _, kv := range strings.Split(*labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				fail(fmt.Errorf("label %q: want key=value", kv))
			}
			spec.Labels[k] = v
		}
	}
	if *output == "" {
		fail(fmt.Errorf("--output is required"))
	}
	written, err := Write(spec, *output)
	if err != nil {
		fail(err)
	}
	if written {
		fmt.Printf("%s: %s\n", *output, spec.Ref)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "images: %v\n", err)
	os.Exit(1)
}
