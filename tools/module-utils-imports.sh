#!/usr/bin/env bash
# The import layers of plugins/module_utils (tools/module-utils.importlinter), on a temporary
# tree where ansible_collections/cozystack/gpu is this checkout, as Ansible names the files.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${BIN:-$root/.venv/bin}"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/ansible_collections/cozystack"
ln -s "$root" "$tree/ansible_collections/cozystack/gpu"
cd "$tree"
PYTHONPATH="$tree" "$bin/lint-imports" --no-cache --config "$root/tools/module-utils.importlinter"
