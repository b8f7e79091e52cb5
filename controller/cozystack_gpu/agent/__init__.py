"""The node agent: one per GPU node (a DaemonSet), writing that node's GPUNode.

It reads the node's GPU functions from sysfs (:mod:`.sysfs`, shared with the Ansible
``gpu_facts`` module), asks kubelet's pod-resources API which of them are allocatable and
which pods hold them (:mod:`.podresources`), turns both into the GPUNode status fields it
owns (:mod:`.report`, pure) and merge-patches them (:mod:`.writer`). It runs standalone,
without kopf peering: every node has its own agent and object.
"""
