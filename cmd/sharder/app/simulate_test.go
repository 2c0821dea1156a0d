package app

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// simulate runs `sharder simulate args...` and returns its output.
func simulate(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(append([]string{"simulate"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

type simulateInstance struct {
	ID           string `json:"id"`
	VirtualNodes int    `json:"virtualNodes"`
	Keys         int    `json:"keys"`
	State        string `json:"state"`
}

type simulateResult struct {
	Algorithm          string             `json:"algorithm"`
	Keys               int                `json:"keys"`
	Instances          []simulateInstance `json:"instances"`
	After              []simulateInstance `json:"after"`
	MaxOverMean        float64            `json:"maxOverMean"`
	MinOverMean        float64            `json:"minOverMean"`
	Moved              int                `json:"moved"`
	MovedFraction      float64            `json:"movedFraction"`
	IdealMovedFraction float64            `json:"idealMovedFraction"`
}

func simulateJSON(t *testing.T, stdin string, args ...string) simulateResult {
	t.Helper()
	out, err := simulate(t, stdin, append(args, "-o", "json")...)
	if err != nil {
		t.Fatalf("simulate %v: %v\n%s", args, err, out)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &fields); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	for _, name := range []string{"maxOverMean", "minOverMean", "movedFraction", "idealMovedFraction", "instances"} {
		if _, ok := fields[name]; !ok {
			t.Fatalf("JSON output lacks %q:\n%s", name, out)
		}
	}
	var res simulateResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	return res
}

func sumKeys(instances []simulateInstance) int {
	n := 0
	for _, in := range instances {
		n += in.Keys
	}
	return n
}

func checkShares(t *testing.T, res simulateResult) {
	t.Helper()
	if got := sumKeys(res.Instances); got != res.Keys {
		t.Fatalf("instances hold %d keys, want %d", got, res.Keys)
	}
	lo, hi := res.Instances[0].Keys, 0
	for _, in := range res.Instances {
		lo, hi = min(lo, in.Keys), max(hi, in.Keys)
	}
	mean := float64(res.Keys) / float64(len(res.Instances))
	if math.Abs(res.MaxOverMean-float64(hi)/mean) > 1e-9 || math.Abs(res.MinOverMean-float64(lo)/mean) > 1e-9 {
		t.Fatalf("maxOverMean %v / minOverMean %v do not match counts %d..%d over mean %v", res.MaxOverMean, res.MinOverMean, lo, hi, mean)
	}
}

// Adding an instance to a consistent-hash ring moves exactly the keys the
// new instance gets.
func TestSimulateAdd(t *testing.T) {
	res := simulateJSON(t, "", "--instances", "10", "--add", "1", "--keys", "5000", "--virtual-nodes", "256")
	checkShares(t, res)
	if res.Algorithm != "consistent-hash" || res.Keys != 5000 || len(res.Instances) != 10 || len(res.After) != 11 {
		t.Fatalf("algorithm %q, %d keys, %d instances, %d after", res.Algorithm, res.Keys, len(res.Instances), len(res.After))
	}
	if got := sumKeys(res.After); got != 5000 {
		t.Fatalf("instances after the change hold %d keys", got)
	}
	var added simulateInstance
	for _, in := range res.After {
		if in.State == "added" {
			added = in
		}
	}
	if added.ID != "instance-10" || added.VirtualNodes != 256 {
		t.Fatalf("added instance = %+v, want instance-10 with 256 virtual nodes", added)
	}
	if res.Moved != added.Keys || math.Abs(res.MovedFraction-float64(added.Keys)/5000) > 1e-9 {
		t.Fatalf("moved %d keys (%v), the added instance holds %d", res.Moved, res.MovedFraction, added.Keys)
	}
	if math.Abs(res.IdealMovedFraction-1.0/11) > 1e-9 {
		t.Fatalf("idealMovedFraction = %v, want 1/11", res.IdealMovedFraction)
	}
}

// Removing instances moves exactly their keys (rendezvous), and statefulset
// names lose their highest ordinals.
func TestSimulateRemove(t *testing.T) {
	res := simulateJSON(t, "", "--algorithm", "rendezvous", "--instances", "5", "--remove", "2", "--keys", "3000")
	checkShares(t, res)
	removedKeys := 0
	for _, in := range res.Instances {
		if in.State == "removed" {
			if in.ID != "instance-3" && in.ID != "instance-4" {
				t.Fatalf("removed %s, want the highest ordinals", in.ID)
			}
			removedKeys += in.Keys
		}
	}
	if len(res.After) != 3 || res.Moved != removedKeys {
		t.Fatalf("%d instances after, moved %d keys, removed instances held %d", len(res.After), res.Moved, removedKeys)
	}
	if math.Abs(res.IdealMovedFraction-0.4) > 1e-9 {
		t.Fatalf("idealMovedFraction = %v, want 0.4", res.IdealMovedFraction)
	}
}

// hash-mod moves most keys when an instance is added; the simulation shows it.
func TestSimulateHashModMovesMost(t *testing.T) {
	res := simulateJSON(t, "", "--algorithm", "hash-mod", "--instances", "4", "--add", "1", "--keys", "4000")
	if res.MovedFraction < 0.6 {
		t.Fatalf("hash-mod moved %v of the keys from 4 to 5 instances, expected most", res.MovedFraction)
	}
}

func TestSimulateDeploymentNames(t *testing.T) {
	args := []string{"--instances", "4", "--instance-names", "deployment", "--prefix", "web", "--remove", "1", "--keys", "100"}
	a := simulateJSON(t, "", append(args, "--seed", "7")...)
	b := simulateJSON(t, "", append(args, "--seed", "7")...)
	c := simulateJSON(t, "", append(args, "--seed", "8")...)
	name := regexp.MustCompile(`^web-[bcdfghjklmnpqrstvwxz2456789]{10}-[bcdfghjklmnpqrstvwxz2456789]{5}$`)
	for i, in := range a.Instances {
		if !name.MatchString(in.ID) {
			t.Fatalf("instance ID %q does not look like a Deployment's pod", in.ID)
		}
		if b.Instances[i] != in {
			t.Fatalf("same seed, different result: %+v vs %+v", in, b.Instances[i])
		}
	}
	if a.Instances[0].ID == c.Instances[0].ID {
		t.Fatalf("seeds 7 and 8 give the same names")
	}
}

func TestSimulateKeysFile(t *testing.T) {
	keys := "apps/Deployment/a/one\n\napps/Deployment/a/two\n  apps/Deployment/a/one  \napps/Deployment/b/three\n"
	path := filepath.Join(t.TempDir(), "keys.txt")
	if err := os.WriteFile(path, []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	res := simulateJSON(t, "", "--instances", "2", "--keys-file", path)
	if res.Keys != 3 {
		t.Fatalf("read %d keys, want 3 (blank lines and repeats skipped)", res.Keys)
	}
	checkShares(t, res)
	if res := simulateJSON(t, keys, "--instances", "2", "--keys-file", "-"); res.Keys != 3 {
		t.Fatalf("read %d keys from stdin, want 3", res.Keys)
	}
	if _, err := simulate(t, "", "--keys-file", filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing keys file gave no error")
	}
	if _, err := simulate(t, "\n\n", "--keys-file", "-"); err == nil || !strings.Contains(err.Error(), "no keys") {
		t.Fatalf("an empty keys file: error = %v, want no keys", err)
	}
}

func TestSimulateTable(t *testing.T) {
	out, err := simulate(t, "", "--instances", "3", "--add", "1", "--keys", "600")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"INSTANCE", "KEYS AFTER", "instance-3", "added", "maxOverMean", "movedFraction", "idealMovedFraction  0.2500"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestSimulateYAML: -o yaml prints the same result as -o json.
func TestSimulateYAML(t *testing.T) {
	args := []string{"--instances", "4", "--add", "1", "--keys", "2000"}
	asJSON, err := simulate(t, "", append(args, "-o", "json")...)
	if err != nil {
		t.Fatalf("simulate -o json: %v\n%s", err, asJSON)
	}
	asYAML, err := simulate(t, "", append(args, "-o", "yaml")...)
	if err != nil {
		t.Fatalf("simulate -o yaml: %v\n%s", err, asYAML)
	}
	var fromJSON, fromYAML map[string]any
	if err := json.Unmarshal([]byte(asJSON), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(asYAML), &fromYAML); err != nil {
		t.Fatalf("output is not YAML: %v\n%s", err, asYAML)
	}
	// The build time is measured again by each run.
	delete(fromJSON, "buildSeconds")
	delete(fromYAML, "buildSeconds")
	if !reflect.DeepEqual(fromJSON, fromYAML) {
		t.Fatalf("-o yaml and -o json differ:\n%s\n%s", asYAML, asJSON)
	}
}

func TestSimulateFlagValidation(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--instances", "0"}, "--instances must be at least 1"},
		{[]string{"--instance-names", "daemonset"}, "--instance-names must be"},
		{[]string{"--prefix", ""}, "--prefix must not be empty"},
		{[]string{"--keys", "0"}, "--keys must be at least 1"},
		{[]string{"--keys", "5", "--keys-file", "x"}, "mutually exclusive"},
		{[]string{"--keys", "5", "--keys-per-instance", "10"}, "mutually exclusive"},
		{[]string{"--keys-per-instance", "0"}, "--keys-per-instance must be at least 1"},
		{[]string{"--weights", "1,2", "--virtual-nodes", "3"}, "mutually exclusive"},
		{[]string{"--weights", "512,0"}, "--weights must be in"},
		{[]string{"--sweep", "2-x"}, "is not N, A-B or A-B:STEP"},
		{[]string{"--sweep", "5:2"}, "is not N, A-B or A-B:STEP"},
		{[]string{"--sweep", "10-2"}, "ranges ascending"},
		{[]string{"--sweep", "0"}, "at least 1"},
		{[]string{"--sweep", "2-3", "--instances", "4"}, "--sweep replaces"},
		{[]string{"--algorithm", "consistent-hash-dense", "--partitions", "100"}, "apply to consistent-hash only"},
		{[]string{"--virtual-nodes", "0"}, "--virtual-nodes must be in"},
		{[]string{"--virtual-nodes", "10001"}, "--virtual-nodes must be in"},
		{[]string{"--add", "-1"}, "--add must not be negative"},
		{[]string{"--remove", "-1"}, "--remove must not be negative"},
		{[]string{"--instances", "3", "--remove", "3"}, "must leave at least one"},
		{[]string{"-o", "xml"}, `invalid argument "xml" for "-o, --output" flag: must be table, json or yaml`},
		{[]string{"--algorithm", "maglev"}, `--algorithm "maglev" is not one of`},
		{[]string{"--partitions", "0"}, "--partitions must be at least 1"},
		{[]string{"--partitions", "16777217"}, "partition count"},
		{[]string{"--load-factor", "0.9"}, "load factor"},
		{[]string{"--algorithm", "range", "--partitions", "100"}, "apply to consistent-hash only"},
		{[]string{"extra"}, "unknown command"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := simulate(t, "", tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one containing %q\n%s", err, tc.want, out)
			}
		})
	}
}

// The new algorithm's figures at a size the issue names, with mixed weights:
// the table carries balance, movement over the ideal and the build time.
func TestSimulateDenseTable(t *testing.T) {
	out, err := simulate(t, "", "--algorithm", "consistent-hash-dense", "--instances", "30", "--weights", "256,512,1024",
		"--keys-per-instance", "2000", "--add", "1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"consistent-hash-dense", "keys                60000", "buildTime", "movedOverIdeal", "instance-30  256"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestSimulateSweep(t *testing.T) {
	out, err := simulate(t, "", "--algorithm", "rendezvous", "--sweep", "1,2-4,10-20:10", "--keys-per-instance", "300")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1+6+2 || !strings.Contains(lines[0], "ADD MOVED/IDEAL") || !strings.Contains(lines[0], "BUILD") {
		t.Fatalf("want a header, 6 sizes and a summary:\n%s", out)
	}
	for i, want := range []string{"1 300", "2 600", "3 900", "4 1200", "10 3000", "20 6000"} {
		if got := strings.Join(strings.Fields(lines[1+i])[:2], " "); got != want {
			t.Errorf("line %d starts with %q, want %q", i+1, got, want)
		}
	}
	if !strings.Contains(lines[len(lines)-1], "rendezvous, 6 sizes") {
		t.Errorf("summary: %q", lines[len(lines)-1])
	}
	var sizes []struct {
		Instances         int     `json:"instances"`
		AddMovedOverIdeal float64 `json:"addMovedOverIdeal"`
	}
	out, err = simulate(t, "", "--sweep", "2,3", "--keys", "900", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &sizes); err != nil || len(sizes) != 2 || sizes[1].Instances != 3 || sizes[1].AddMovedOverIdeal == 0 {
		t.Fatalf("JSON sweep %v: %s", err, out)
	}
}
