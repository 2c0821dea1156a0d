//go:build tools

// Package tools records the commands this module builds, so that go mod tidy
// keeps their dependencies: promtool, which checks and unit-tests the chart's
// alerting rules with Prometheus's own rule engine, and prometheus, the
// server the real-cluster suite scrapes the sharder with to run the chart's
// alerts and dashboard queries on live metrics.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
