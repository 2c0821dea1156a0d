package main

import (
	"strings"
	"testing"
)

// TestDiskShortage checks the space the node asks for before it starts: the
// kubelet's eviction threshold (1% of the filesystem) plus its reserve.
func TestDiskShortage(t *testing.T) {
	const gi = 1 << 30
	size := uint64(258 * gi)
	if err := diskShortage("/x", 34*gi, size); err != nil {
		t.Errorf("34 GiB of 258: %v", err)
	}
	err := diskShortage("/x", 3*gi+gi/2, size)
	if err == nil {
		t.Fatal("3.5 GiB of 258 (the eviction threshold is 2.6 GiB): no error")
	}
	for _, want := range []string{"/x", "3.5 GiB available", "6.6 GiB", "evicts pods"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := diskShortage("/x", size/100+diskReserve, size); err != nil {
		t.Errorf("exactly the threshold plus the reserve: %v", err)
	}
}
