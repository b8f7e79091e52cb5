// Command kubevirt-manifests prints what virt-operator would install for virt-controller at
// the pinned KubeVirt release, as one multi-document YAML stream on stdout: every CRD of its
// install strategy plus the KubeVirt CRD, then virt-controller's ServiceAccount, ClusterRole,
// Role and their bindings in the namespace given as the only argument. It calls
// virt-operator's own generators rather than copying their output, so the rules follow the
// release the test platform runs.
package main

import (
	"fmt"
	"os"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/rbac"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kubevirt-manifests NAMESPACE")
		os.Exit(2)
	}
	// The list of install/strategy.go's GenerateCurrentInstallStrategy, and the KubeVirt CRD
	// virt-operator's own manifest carries.
	generators := []func() (*extv1.CustomResourceDefinition, error){
		components.NewVirtualMachineInstanceCrd, components.NewPresetCrd, components.NewReplicaSetCrd,
		components.NewVirtualMachineCrd, components.NewVirtualMachineInstanceMigrationCrd,
		components.NewVirtualMachineSnapshotCrd, components.NewVirtualMachineSnapshotContentCrd,
		components.NewVirtualMachineRestoreCrd, components.NewVirtualMachineInstancetypeCrd,
		components.NewVirtualMachineClusterInstancetypeCrd, components.NewVirtualMachinePoolCrd,
		components.NewMigrationPolicyCrd, components.NewVirtualMachinePreferenceCrd,
		components.NewVirtualMachineClusterPreferenceCrd, components.NewVirtualMachineExportCrd,
		components.NewVirtualMachineCloneCrd, components.NewVirtualMachineBackupCrd,
		components.NewVirtualMachineBackupTrackerCrd,
		components.NewKubeVirtCrd,
	}
	var objects []any
	for _, generate := range generators {
		crd, err := generate()
		if err != nil {
			fail(err)
		}
		objects = append(objects, crd)
	}
	// With the NetworkAttachmentDefinition rule, as virt-operator's default (no external
	// network resource injection) installs it.
	for _, obj := range rbac.GetAllController(os.Args[1], true) {
		objects = append(objects, obj)
	}
	for _, obj := range objects {
		out, err := yaml.Marshal(obj)
		if err != nil {
			fail(err)
		}
		fmt.Printf("---\n%s", out)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "kubevirt-manifests: %v\n", err)
	os.Exit(1)
}
