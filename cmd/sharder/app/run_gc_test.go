package app

import "testing"

func TestDefaultGCPercent(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if got, set := defaultGCPercent(env(nil)); !set || got != sharderGCPercent {
		t.Errorf("without GOGC: got (%d, %v), want (%d, true)", got, set, sharderGCPercent)
	}
	if _, set := defaultGCPercent(env(map[string]string{"GOGC": "200"})); set {
		t.Error("with GOGC set: the sharder overrode the operator's choice")
	}
}
