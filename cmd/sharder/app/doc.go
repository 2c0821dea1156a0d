// Package app builds the sharder's cobra commands: run, agent, status,
// simulate and version. Each command lives in its own file; NewRootCommand
// assembles them.
package app
