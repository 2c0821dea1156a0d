//go:build !unix

package ring_test

import "time"

// processCPU is not measured on this platform.
func processCPU() time.Duration { return 0 }
