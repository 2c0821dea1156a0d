package main

import (
	"fmt"
	"syscall"
)

// diskReserve is the space the node needs beyond the kubelet's eviction
// threshold: the images imported into containerd, their unpacked layers,
// the pods' logs and volumes and etcd's data.
const diskReserve = 4 << 30

// checkDisk refuses to start the node when the filesystem holding dir has
// too little space left. The kubelet evicts pods and deletes unused images
// once less than 1% of the filesystem is available (kubeletConfig), and an
// image deleted here cannot be pulled again: a pod scaled down and up again
// then fails with ErrImagePull, far from the cause.
func checkDisk(dir string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("reading the free space of %s: %w", dir, err)
	}
	bsize := uint64(max(st.Bsize, 0))
	return diskShortage(dir, st.Bavail*bsize, st.Blocks*bsize)
}

// diskShortage returns an error when available bytes of a filesystem of
// size bytes are less than the kubelet's eviction threshold (1% of size)
// plus diskReserve.
func diskShortage(dir string, available, size uint64) error {
	need := size/100 + diskReserve
	if available >= need {
		return nil
	}
	return fmt.Errorf("the filesystem of %s has %.1f GiB available, and the node needs %.1f GiB: the kubelet evicts pods and "+
		"deletes images, which cannot be pulled again here, once less than 1%% of it (%.1f GiB) is left; free some space first",
		dir, gib(available), gib(need), gib(size/100))
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }
