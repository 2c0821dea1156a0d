package main

import (
	"strings"
	"testing"
)

func TestFailures(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestOK"}`,
		`{"Action":"output","Package":"p","Test":"TestOK","Output":"    a_test.go:3: fine\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestOK"}`,
		`{"Action":"output","Package":"p","Test":"TestBad","Output":"{\"level\":\"info\",\"msg\":\"a process log line\"}\n"}`,
		`{"Action":"output","Package":"p","Test":"TestBad","Output":"    bad_test.go:10: \n"}`,
		`{"Action":"output","Package":"p","Test":"TestBad","Output":"        Timed out after 60s.\n"}`,
		`{"Action":"output","Package":"p","Test":"TestBad","Output":"        Expected 1 to equal 2\n"}`,
		`{"Action":"output","Package":"p","Test":"TestBad","Output":"----- log of instance-0 -----\n"}`,
		`{"Action":"output","Package":"p","Test":"TestBad","Output":"    dump line indented like a message\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestBad"}`,
		`{"Action":"fail","Package":"p"}`,
		`not json`,
		`{"Action":"output","Package":"q","Output":"q.go:1:2: undefined: x\n"}`,
		`{"Action":"output","Package":"q","Output":"FAIL\tq [build failed]\n"}`,
		`{"Action":"fail","Package":"q"}`,
	}, "\n")
	got, err := failures(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d failures, want 2 (p.TestBad and the build failure of q): %+v", len(got), got)
	}
	if got[0].name != "p.TestBad" || strings.Join(got[0].messages, "|") != "    bad_test.go:10: |        Timed out after 60s.|        Expected 1 to equal 2" {
		t.Errorf("p.TestBad: got %q %q", got[0].name, got[0].messages)
	}
	if got[1].name != "q" || len(got[1].messages) != 2 || !strings.Contains(got[1].messages[0], "undefined: x") {
		t.Errorf("q: got %q %q", got[1].name, got[1].messages)
	}
}
