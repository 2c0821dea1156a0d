// Package s3test runs a real S3-compatible store for tests: the versitygw
// gateway the project builds (make tools, or make test), as a local process
// on 127.0.0.1 storing objects in a folder of the test.
package s3test
