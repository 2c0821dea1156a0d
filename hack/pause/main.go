// Command pause is the sandbox ("pause") container of the local cluster
// (make cluster): it holds a pod's namespaces open and does nothing until it is
// told to stop. The upstream pause image cannot be pulled there, so this one is
// built from source by make images.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
