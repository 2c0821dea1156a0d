package config

import (
	"errors"
	"fmt"
	"os"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// LoadFile reads the YAML file at path into cfg. Fields absent from the file
// keep the value cfg already has (start from Default). Unknown or duplicate
// fields are an error naming the field, so a misspelt key does not pass
// silently.
func LoadFile(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading config file: %w", err)
	}
	if err := Load(data, cfg); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// Load decodes YAML (or JSON) data into cfg like LoadFile.
func Load(data []byte, cfg *Config) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("decoding YAML: %w", err)
	}
	strict, err := kjson.UnmarshalStrict(js, cfg, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	if len(strict) > 0 {
		return fmt.Errorf("decoding: %w", errors.Join(strict...))
	}
	return nil
}
