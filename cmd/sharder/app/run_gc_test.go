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

func TestMemoryLimit(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		name  string
		env   map[string]string
		want  int64
		set   bool
		error bool
	}{
		{name: "no container limit", env: nil},
		{name: "90 % of the container's limit", env: map[string]string{memoryLimitEnv: "536870912"}, want: 483183820, set: true},
		{name: "GOMEMLIMIT chosen by the operator", env: map[string]string{memoryLimitEnv: "536870912", "GOMEMLIMIT": "300MiB"}},
		{name: "not a number", env: map[string]string{memoryLimitEnv: "512Mi"}, error: true},
		{name: "zero", env: map[string]string{memoryLimitEnv: "0"}, error: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, set, err := memoryLimit(env(tc.env))
			if (err != nil) != tc.error || got != tc.want || set != tc.set {
				t.Errorf("got (%d, %v, %v), want (%d, %v, error %v)", got, set, err, tc.want, tc.set, tc.error)
			}
		})
	}
}
