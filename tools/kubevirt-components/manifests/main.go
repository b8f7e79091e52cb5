// Command kubevirt-manifests prints what virt-operator would install for virt-controller and
// virt-api at the pinned KubeVirt release, as one multi-document YAML stream on stdout: every
// CRD of its install strategy plus the KubeVirt CRD; the ServiceAccount, ClusterRoles, Role
// and bindings of virt-controller, virt-api and virt-handler in the namespace given as the
// only argument (virt-handler's for the identity the test kit writes VMI status with: it
// plays virt-handler, and virt-api drops status writes of anyone else); and virt-api's
// mutating and validating webhook configurations and the virt-launcher pod one, pointing at
// the Service virt-api in that namespace. It calls virt-operator's own generators rather
// than copying their output, so the rules follow the release the test platform runs.
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
	namespace := os.Args[1]
	for _, obj := range rbac.GetAllController(namespace, true) {
		objects = append(objects, obj)
	}
	for _, obj := range rbac.GetAllApiServer(namespace) {
		objects = append(objects, obj)
	}
	for _, obj := range rbac.GetAllHandler(namespace) {
		objects = append(objects, obj)
	}
	objects = append(objects,
		components.NewVirtAPIMutatingWebhookConfiguration(namespace),
		components.NewVirtAPIValidatingWebhookConfiguration(namespace),
		components.NewVirtLauncherPodMutatingWebhookConfiguration(namespace),
	)
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
