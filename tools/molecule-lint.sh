#!/usr/bin/env bash
# ansible-lint (production profile, offline) over the roles, playbooks and molecule scenarios,
# run inside a copy of the working tree installed as ansible_collections/cozystack/gpu so the
# collection's own modules and roles resolve by FQCN without installing anything.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
if [ -d "$repo/.venv/bin" ]; then
  export PATH="$repo/.venv/bin:$PATH"
fi

work=$(mktemp -d /tmp/cozystack-gpu-lint.XXXXXX)
trap 'rm -rf "$work"' EXIT
collection="$work/ansible_collections/cozystack/gpu"
mkdir -p "$collection"
# Only what ansible-lint reads, plus the plugins the tasks name, the controller files their
# module_utils link to, and the fixture library (with the pci.ids excerpt it reads).
tar -C "$repo" --warning=no-file-changed -cf - galaxy.yml meta plugins roles playbooks molecule \
  controller/cozystack_gpu/keys.py controller/cozystack_gpu/agent/sysfs.py \
  controller/cozystack_gpu_testkit/sysfs_tree.py controller/cozystack_gpu_testkit/pci.ids |
  tar -C "$collection" -xf -
cd "$collection"
export ANSIBLE_COLLECTIONS_PATH="$work"
if [ $# -eq 0 ]; then set -- roles playbooks molecule; fi
exec ansible-lint --offline --profile production "$@"
