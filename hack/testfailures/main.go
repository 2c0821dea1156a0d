// Command testfailures prints the assertions of the failed tests recorded in
// a go test -json file (gotestsum --jsonfile), so that they close a long test
// log: the process logs a failed end-to-end test dumps can run to thousands
// of lines, and whoever reads only the end of the log still learns what
// failed and where.
//
//	testfailures [--max-lines N] [--width N] FILE...
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// event is one line of go test -json (test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// assertion matches the first line of a t.Error or t.Log message:
// "    file_test.go:123: message".
var assertion = regexp.MustCompile(`^\s+[\w.-]+_test\.go:\d+: `)

// failure is a failed test with the messages it logged.
type failure struct {
	name     string
	messages []string
}

// failures reads test2json events and returns the failed tests, each with
// the messages the test logged (file:line lines and the indented lines that
// continue them), in the order the tests failed. A failed package with no
// failed test (a build error, a panic in TestMain) is returned with its
// last lines of output.
func failures(r io.Reader) ([]failure, error) {
	type key struct{ pkg, test string }
	output := map[key][]string{}
	var failed []key
	failedTests := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // gotestsum may record lines that are not events
		}
		k := key{ev.Package, ev.Test}
		switch ev.Action {
		case "output":
			output[k] = append(output[k], strings.TrimRight(ev.Output, "\n"))
		case "fail":
			failed = append(failed, k)
			if ev.Test != "" {
				failedTests[ev.Package] = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []failure
	for _, k := range failed {
		name := k.pkg
		if k.test != "" {
			name += "." + k.test
		} else if failedTests[k.pkg] {
			continue // its tests are listed
		}
		f := failure{name: name}
		if k.test == "" {
			lines := output[k]
			f.messages = lines[max(0, len(lines)-10):]
		} else {
			f.messages = messages(output[k])
		}
		out = append(out, f)
	}
	return out, nil
}

// messages returns the file:line messages among lines, each with the lines
// indented below it that continue it.
func messages(lines []string) []string {
	var out []string
	indent := -1
	for _, l := range lines {
		if assertion.MatchString(l) {
			indent = len(l) - len(strings.TrimLeft(l, " \t"))
			out = append(out, l)
			continue
		}
		if indent >= 0 && len(l)-len(strings.TrimLeft(l, " \t")) > indent && strings.TrimSpace(l) != "" {
			out = append(out, l)
			continue
		}
		indent = -1
	}
	return out
}

func main() {
	maxLines := flag.Int("max-lines", 8, "Lines printed per message at most; 0 prints every line.")
	width := flag.Int("width", 400, "Characters printed per line at most; 0 prints whole lines.")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: testfailures [--max-lines N] [--width N] FILE...")
		os.Exit(2)
	}
	var fs []failure
	for _, path := range flag.Args() {
		f, err := os.Open(path)
		if os.IsNotExist(err) {
			continue // that run did not start
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "testfailures: %v\n", err)
			os.Exit(1)
		}
		more, err := failures(f)
		_ = f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "testfailures: reading %s: %v\n", path, err)
			os.Exit(1)
		}
		fs = append(fs, more...)
	}
	if len(fs) == 0 {
		return
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	fmt.Fprintf(w, "=== %d failed (their whole output is above):\n", len(fs))
	for _, f := range fs {
		fmt.Fprintf(w, "--- FAIL: %s\n", f.name)
		printed := 0
		for _, m := range f.messages {
			if assertion.MatchString(m) {
				printed = 0
			}
			if *maxLines > 0 && printed >= *maxLines {
				continue
			}
			if *width > 0 && len(m) > *width {
				m = m[:*width] + "…"
			}
			fmt.Fprintln(w, m)
			printed++
		}
	}
}
