// Package reconcilelog records when each reconcile starts and ends, one JSON
// line per event, so that the reconciles of several instances can be laid
// side by side afterwards (the end-to-end tests check that two instances
// never reconcile one object at the same time).
//
// A line looks like:
//
//	{"time":"2026-01-02T15:04:05.123456789Z","instance":"etcd-operator-0","namespace":"db","name":"main","phase":"start","generation":0}
//
// phase is "start" or "end"; generation is the object's generation the
// reconcile saw, reported by the reconciler through SetGeneration (0 when it
// did not report one, always 0 on "start"); an "end" line of a failed
// reconcile carries "error". Each line is written with a single write to a
// file opened for appending, so a killed process leaves at most a torn last
// line.
package reconcilelog
