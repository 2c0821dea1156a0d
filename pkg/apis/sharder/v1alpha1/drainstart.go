package v1alpha1

import "time"

// DrainStartedAnnotationPrefix + ring name is the annotation on an object
// whose drain is in flight: when the sharder requested the drain, in
// DrainStartedFormat, by the clock of the sharder replica that wrote it. A
// newly elected sharder counts the drain's timeout from it instead of from
// its own start, so that a rollout of the sharder does not restart every
// drainTimeout. The sharder writes it with the drain label and removes it
// with the drain label; an acknowledgement by pkg/drain removes it too.
const DrainStartedAnnotationPrefix = "drain-started.sharder.dev/"

// DrainStartedFormat is the layout of the drain start annotation's value
// (RFC 3339, UTC, milliseconds).
const DrainStartedFormat = "2006-01-02T15:04:05.000Z07:00"

// DrainStartedAnnotation returns the annotation key holding when the drain of
// an object of ring started.
func DrainStartedAnnotation(ring string) string { return DrainStartedAnnotationPrefix + ring }

// FormatDrainStarted returns t as the drain start annotation's value.
func FormatDrainStarted(t time.Time) string { return t.UTC().Format(DrainStartedFormat) }

// ParseDrainStarted parses a drain start annotation's value (any RFC 3339
// time); false when it is not one.
func ParseDrainStarted(value string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, value)
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}
