package chart_test

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the values table of README.md from values.yaml")

// The README's values table sits between these markers.
const (
	tableBegin = "<!-- values table: generated from values.yaml by readme_test.go; go test ./charts/sharder -run TestReadmeValues -update -->"
	tableEnd   = "<!-- end of the values table -->"
)

// valueDoc is one documented value of values.yaml.
type valueDoc struct {
	path string
	doc  string
}

var (
	keyLineRE = regexp.MustCompile(`^( *)([A-Za-z_][A-Za-z0-9_]*):`)
	// exampleRE finds where a doc comment turns into a YAML example: a line
	// indented under the text that starts with a key or a list item.
	exampleRE = regexp.MustCompile(`^ {2,}(- |[A-Za-z][A-Za-z0-9_-]*:( |$))`)
)

// documentedValues reads the values of values.yaml that carry a "# --" doc
// comment, in file order, with the comment's text up to any YAML example.
// It also returns the keys that have neither a doc comment nor documented
// keys below them.
func documentedValues(text string) (docs []valueDoc, undocumented []string) {
	var (
		stack   []string // keys of the enclosing maps
		indents []int
		comment []string
		inDoc   bool
		example bool
		// childDocs is, per open map, 1 once one of its keys is
		// documented, else -1.
		childDocs []int
		// body is the indentation of a documented map whose keys are its
		// default (resources, security contexts), -1 outside one.
		body = -1
	)
	closeTo := func(indent int) {
		for len(indents) > 0 && indents[len(indents)-1] >= indent {
			last := len(stack) - 1
			if childDocs[last] < 0 {
				undocumented = append(undocumented, strings.Join(stack, "."))
			}
			stack, indents, childDocs = stack[:last], indents[:last], childDocs[:last]
		}
	}
	scanner := bufio.NewScanner(strings.NewReader(text))
	for scanner.Scan() {
		line := scanner.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "# --"):
			comment, inDoc, example = []string{strings.TrimSpace(strings.TrimPrefix(trimmed, "# --"))}, true, false
			continue
		case strings.HasPrefix(trimmed, "#"):
			if inDoc && !example {
				rest := strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " ")
				if exampleRE.MatchString(rest) {
					example = true
					comment = append(comment, "(example in values.yaml)")
				} else {
					comment = append(comment, strings.TrimSpace(rest))
				}
			}
			continue
		case trimmed == "":
			inDoc = false
			continue
		}
		m := keyLineRE.FindStringSubmatch(line)
		if m == nil {
			inDoc = false
			continue // inside a list or a default's body
		}
		indent := len(m[1])
		if body >= 0 && indent > body {
			continue
		}
		body = -1
		closeTo(indent)
		path := strings.Join(append(append([]string{}, stack...), m[2]), ".")
		documented := inDoc
		if documented {
			docs = append(docs, valueDoc{path: path, doc: strings.Join(comment, " ")})
			for i := range childDocs {
				childDocs[i] = 1
			}
		}
		inDoc = false
		rest := strings.TrimSpace(line[len(m[0]):])
		switch {
		case rest == "" && !documented:
			// A map whose keys carry the docs: -1 until one does.
			stack, indents, childDocs = append(stack, m[2]), append(indents, indent), append(childDocs, -1)
		case rest == "":
			// A documented map (a default such as resources): its keys
			// are part of the default, not values of their own.
			body = indent
		case !documented:
			undocumented = append(undocumented, path)
		}
	}
	closeTo(0)
	return docs, undocumented
}

// lookup returns the value at a dotted path of values.
func lookup(values map[string]any, path string) any {
	var v any = values
	for _, k := range strings.Split(path, ".") {
		v = v.(map[string]any)[k]
	}
	return v
}

// valuesTable renders the Markdown table of the documented values.
func valuesTable(t *testing.T) string {
	t.Helper()
	text, values := readValues(t)
	docs, undocumented := documentedValues(text)
	if len(undocumented) > 0 {
		t.Errorf("values.yaml: document these keys with a \"# --\" comment above them: %v", undocumented)
	}
	var b strings.Builder
	b.WriteString("| Key | Default | Description |\n| --- | --- | --- |\n")
	for _, d := range docs {
		def, err := json.Marshal(lookup(values, d.path))
		if err != nil {
			t.Fatal(err)
		}
		// Markdown would take <fullname> for an HTML tag.
		doc := strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(d.doc)
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", d.path, strings.ReplaceAll(string(def), "|", `\|`), doc)
	}
	return b.String()
}

// TestReadmeValues keeps the values table of README.md in line with
// values.yaml: every documented value, its default and its comment.
func TestReadmeValues(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	begin, end := strings.Index(readme, tableBegin), strings.Index(readme, tableEnd)
	if begin < 0 || end < begin {
		t.Fatalf("README.md lacks the markers of the values table:\n%s\n%s", tableBegin, tableEnd)
	}
	want := tableBegin + "\n\n" + valuesTable(t) + "\n"
	got := readme[begin:end]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile("README.md", []byte(readme[:begin]+want+readme[end:]), 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("the values table of README.md differs from values.yaml: run `go test ./charts/sharder -run TestReadmeValues -update`")
}

// TestValuesDocumented: the table leaves out no value of the schema's top
// level, so that a value is documented where users look.
func TestValuesDocumented(t *testing.T) {
	t.Parallel()
	text, _ := readValues(t)
	docs, _ := documentedValues(text)
	seen := map[string]bool{}
	for _, d := range docs {
		seen[strings.Split(d.path, ".")[0]] = true
	}
	for k := range readSchema(t)["properties"].(map[string]any) {
		if !seen[k] && k != "global" {
			t.Errorf("%s: no documented value in values.yaml", k)
		}
	}
}
