// Command pause is the sandbox process of every pod on the test platform's real node: the
// process that holds a pod's namespaces while its containers come and go. Kubernetes' own
// pause image lives in a registry this machine cannot reach, so this one is built from
// source (tools/build-binaries.sh) and imported into containerd from an OCI archive.
//
// It does what the upstream one does: as PID 1 of a shared PID namespace it reaps the
// orphans handed to it, and it exits on SIGINT or SIGTERM (as PID 1 it has no default
// handlers, so without this the runtime would have to SIGKILL it).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
