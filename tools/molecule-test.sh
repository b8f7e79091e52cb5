#!/usr/bin/env bash
# Runs the collection's molecule scenarios (podman, systemd containers) against a copy of the
# working tree installed as ansible_collections/cozystack/gpu, so roles and modules resolve by
# their FQCN exactly as they do for a user of the collection.
#
# Usage: tools/molecule-test.sh [scenario ...]   (default: every scenario under molecule/)
#        MOLECULE_COMMAND=converge tools/molecule-test.sh vfio   (any molecule subcommand)
# Needs root (podman rootful, apt-get on the first run); prepares the platform itself.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
log() { echo "[molecule-test] $*" >&2; }

if [ -d "$repo/.venv/bin" ]; then
  export PATH="$repo/.venv/bin:$PATH"
fi

image=$("$here/molecule-platform.sh" | tail -n1)
export COZYSTACK_GPU_MOLECULE_IMAGE="$image"

# A fixed place, refreshed on every run: molecule keys its instance state by the scenario's
# path, so `MOLECULE_COMMAND=converge` then `=verify` can iterate on one running instance.
work=${COZYSTACK_GPU_MOLECULE_WORK:-/tmp/cozystack-gpu-molecule-work}
collection="$work/ansible_collections/cozystack/gpu"
mkdir -p "$work"
# One run at a time: a second one would replace the tree under the first.
exec 9>"$work/.lock"
if ! flock -n 9; then
  log "another molecule-test run holds $work; waiting for it"
  flock 9
fi
rm -rf "$collection"
mkdir -p "$collection"
# The working tree, as a user would install it (no venv, caches or git metadata).
# Other builds may be writing caches meanwhile: those are left out, and tar's status 1 ("file
# changed as we read it") is tolerated; anything worse stops the run.
set +o pipefail
tar -C "$repo" --warning=no-file-changed --warning=no-file-removed \
  --exclude=./.venv --exclude=./.git --exclude=./.cache --exclude=./.ci --exclude=./tests/output \
  --exclude=__pycache__ --exclude=.mypy_cache --exclude=.ruff_cache --exclude=.pytest_cache \
  --exclude=.hypothesis --exclude=./controller/build --exclude='*.tar.gz' \
  -cf - . | tar -C "$collection" -xf -
status=("${PIPESTATUS[@]}")
set -o pipefail
if [ "${status[0]}" -gt 1 ] || [ "${status[1]}" -ne 0 ]; then
  log "copying the working tree failed (tar: ${status[*]})"
  exit 1
fi

export ANSIBLE_COLLECTIONS_PATH="$work"
export ANSIBLE_FORCE_COLOR=${ANSIBLE_FORCE_COLOR:-0}
export MOLECULE_NO_LOG=false

if [ $# -gt 0 ]; then
  scenarios=("$@")
else
  scenarios=()
  for dir in "$repo"/molecule/*/; do
    [ -f "$dir/molecule.yml" ] && scenarios+=("$(basename "$dir")")
  done
fi

cd "$collection"
failed=()
for scenario in "${scenarios[@]}"; do
  start=$SECONDS
  log "scenario $scenario"
  if molecule "${MOLECULE_COMMAND:-test}" -s "$scenario"; then
    log "scenario $scenario passed in $((SECONDS - start)) s"
  else
    log "scenario $scenario FAILED after $((SECONDS - start)) s"
    failed+=("$scenario")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  log "failed: ${failed[*]}"
  exit 1
fi
log "all scenarios passed: ${scenarios[*]}"
