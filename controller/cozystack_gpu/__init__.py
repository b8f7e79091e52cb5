"""cozystack.gpu controller: GPU catalog, claims and inventory for KubeVirt VMs."""
