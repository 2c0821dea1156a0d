// Package config is the configuration file of `sharder run`: its YAML types,
// their defaults (filled in one place, Default) and their validation.
//
// Most callers need three calls:
//
//	cfg := config.Default()
//	err := config.LoadFile(path, cfg) // fields absent from the file keep their defaults
//	err = cfg.Validate()              // errors name the bad field, e.g. leaderElection.renewDeadline
//
// Command-line flags override the file: `sharder run` applies them after
// LoadFile and before Validate.
package config
