//go:build tools

// Package tools records the command this module builds, so that go mod tidy
// keeps its dependencies: promtool, which checks and unit-tests the chart's
// alerting rules with Prometheus's own rule engine.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
