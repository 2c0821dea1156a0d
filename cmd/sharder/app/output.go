package app

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// The output formats every command that prints a report accepts with -o.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// outputFormats are the values of -o, the default first.
var outputFormats = []string{outputTable, outputJSON, outputYAML}

const formatList = outputTable + ", " + outputJSON + " or " + outputYAML

// outputFormat is the value of a command's -o flag. It refuses an unknown
// format when the flag is parsed, so that every command answers a wrong
// value with the same message before it talks to a cluster.
type outputFormat string

func (f *outputFormat) String() string { return string(*f) }

func (f *outputFormat) Set(s string) error {
	for _, known := range outputFormats {
		if s == known {
			*f = outputFormat(s)
			return nil
		}
	}
	return fmt.Errorf("must be %s", formatList)
}

func (f *outputFormat) Type() string { return "format" }

// structured says whether the format is one for scripts (JSON or YAML).
func (f outputFormat) structured() bool { return f == outputJSON || f == outputYAML }

// addOutputFlag adds -o/--output to cmd, with the table as the default and
// completion of the formats.
func addOutputFlag(cmd *cobra.Command, f *outputFormat) {
	*f = outputTable
	cmd.Flags().VarP(f, "output", "o", "Output format: "+formatList+".")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
}

// writeStructured prints v as indented JSON or as YAML; format must be
// structured.
func writeStructured(out io.Writer, format outputFormat, v any) error {
	if format == outputYAML {
		data, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encoding YAML: %w", err)
		}
		_, err = out.Write(data)
		return err
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
