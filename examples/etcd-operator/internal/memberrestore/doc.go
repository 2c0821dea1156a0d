// Package memberrestore makes one etcd member's data directory from a
// snapshot in an S3-compatible store: it downloads the snapshot and restores
// it with etcdutl's snapshot package, as the member of the new cluster. The
// operator's restore-member subcommand runs it in the init container of a
// restored cluster's members.
package memberrestore
