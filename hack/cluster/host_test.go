package main

import (
	"reflect"
	"testing"
)

func TestShellWords(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{`-N KUBE-SERVICES`, []string{"-N", "KUBE-SERVICES"}},
		{`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			[]string{"-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}},
		{`-A POSTROUTING -m comment --comment "name: \"sharder-cluster\" id: \"abc\"" -j CNI-1`,
			[]string{"-A", "POSTROUTING", "-m", "comment", "--comment", `name: "sharder-cluster" id: "abc"`, "-j", "CNI-1"}},
		{`-A X --comment ""`, []string{"-A", "X", "--comment", ""}},
		{``, nil},
	} {
		if got := shellWords(tc.line); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("shellWords(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

func TestJumpsToOurs(t *testing.T) {
	for _, tc := range []struct {
		rule []string
		want bool
	}{
		{[]string{"-A", "PREROUTING", "-j", "KUBE-SERVICES"}, true},
		{[]string{"-A", "POSTROUTING", "-s", "10.98.0.2/32", "-j", "CNI-0123"}, true},
		{[]string{"-A", "FORWARD", "-g", "KUBE-FORWARD"}, true},
		{[]string{"-A", "INPUT", "-j", "ACCEPT"}, false},
		{[]string{"-A", "INPUT", "-m", "comment", "--comment", "KUBE-SERVICES"}, false},
		{[]string{"-A", "INPUT", "-j"}, false},
	} {
		if got := jumpsToOurs(tc.rule); got != tc.want {
			t.Errorf("jumpsToOurs(%q) = %v, want %v", tc.rule, got, tc.want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/plain/path`:       "/plain/path",
		`/with\040space`:    "/with space",
		`/tab\011and\134bs`: "/tab\tand\\bs",
		`/trailing\`:        `/trailing\`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}
