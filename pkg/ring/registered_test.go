package ring

import "testing"

func TestRegistered(t *testing.T) {
	Register("registered-test", AlgorithmFunc(buildRendezvous))
	for name, want := range map[string]bool{
		"":                  true, // the default, consistent-hash
		ConsistentHash:      true,
		ConsistentHashDense: true,
		Rendezvous:          true,
		HashMod:             true,
		Range:               true,
		"registered-test":   true,
		"never-registered":  false,
	} {
		if got := Registered(name); got != want {
			t.Errorf("Registered(%q) = %v, want %v", name, got, want)
		}
		if _, err := New(name, nil); (err == nil) != want {
			t.Errorf("New(%q) error %v, but Registered says %v", name, err, want)
		}
	}
}
