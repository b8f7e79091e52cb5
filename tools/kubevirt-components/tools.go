//go:build tools

// Package tools pins the KubeVirt commands the test platform builds.
package tools

import (
	_ "kubevirt.io/kubevirt/cmd/virt-api"
	_ "kubevirt.io/kubevirt/cmd/virt-controller"
)
