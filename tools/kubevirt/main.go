// Command kubevirt-crds prints KubeVirt's CustomResourceDefinitions as virt-operator would
// install them, as one multi-document YAML stream on stdout. It calls virt-operator's own
// generator rather than copying its output, so the schema follows the pinned release.
package main

import (
	"fmt"
	"os"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

func main() {
	// The workload kinds a GPU start path touches, and the instance types a VM may draw its
	// GPUs from.
	generators := []func() (*extv1.CustomResourceDefinition, error){
		components.NewVirtualMachineInstanceCrd,
		components.NewVirtualMachineCrd,
		components.NewVirtualMachineInstancetypeCrd,
		components.NewVirtualMachineClusterInstancetypeCrd,
	}
	for _, generate := range generators {
		crd, err := generate()
		if err != nil {
			fmt.Fprintf(os.Stderr, "kubevirt-crds: %v\n", err)
			os.Exit(1)
		}
		out, err := yaml.Marshal(crd)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kubevirt-crds: %s: %v\n", crd.Name, err)
			os.Exit(1)
		}
		fmt.Printf("---\n%s", out)
	}
}
