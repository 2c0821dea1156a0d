// Command etcd is the etcd server of the previous minor release (3.5), built
// from go.etcd.io/etcd/server/v3 for the etcd operator's upgrade test. It is a
// module of its own: its dependencies must not move the control plane's.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
