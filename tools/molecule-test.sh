#!/usr/bin/env bash
# Runs the collection's molecule scenarios (podman, systemd containers) against a copy of the
# working tree installed as ansible_collections/cozystack/gpu, so roles and modules resolve by
# their FQCN exactly as they do for a user of the collection.
#
# Usage: tools/molecule-test.sh [scenario ...]   (default: every scenario under molecule/)
#        COZYSTACK_GPU_MOLECULE_LANES=1 tools/molecule-test.sh   (one scenario at a time)
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

# Scenarios run LANES at a time (default 2), each in its own container with its own output
# file, printed whole when it ends: ansible drives one host per scenario and keeps about one
# core busy, so on two cores two lanes took 12 minutes where one after the other took 18
# (2026-12-07; each scenario runs about a quarter slower beside another).
# The longest scenarios of the last run start first (their seconds are kept in $work).
lanes=${COZYSTACK_GPU_MOLECULE_LANES:-2}
durations="$work/.durations"
logs="$work/logs"
rm -rf "$logs"
mkdir -p "$logs"
if [ -f "$durations" ]; then
  mapfile -t scenarios < <(
    for s in "${scenarios[@]}"; do
      printf '%s %s\n' "$(awk -v s="$s" '$1 == s {print $2}' "$durations" | tail -n1)" "$s"
    done | sort -k1,1nr -k2 | awk '{print $NF}'
  )
fi

run_scenario() {
  local scenario=$1 start=$SECONDS rc=0
  molecule "${MOLECULE_COMMAND:-test}" -s "$scenario" >"$logs/$scenario.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - start))" >"$logs/$scenario.rc"
}

report() {
  local scenario=$1 rc seconds
  read -r rc seconds <"$logs/$scenario.rc"
  log "scenario $scenario output:"
  cat "$logs/$scenario.log"
  if [ "$rc" -eq 0 ]; then
    log "scenario $scenario passed in $seconds s"
    # Only a whole test's seconds order the next run.
    if [ "${MOLECULE_COMMAND:-test}" = test ]; then
      echo "$scenario $seconds" >>"$durations.new"
    fi
  else
    log "scenario $scenario FAILED after $seconds s"
    failed+=("$scenario")
  fi
}

failed=()
declare -A running=()
rm -f "$durations.new"
for scenario in "${scenarios[@]}"; do
  while [ ${#running[@]} -ge "$lanes" ]; do
    wait -n || true
    for done_scenario in "${!running[@]}"; do
      if [ -f "$logs/$done_scenario.rc" ]; then
        unset "running[$done_scenario]"
        report "$done_scenario"
      fi
    done
  done
  log "scenario $scenario started"
  run_scenario "$scenario" &
  running[$scenario]=$!
done
wait
for done_scenario in "${!running[@]}"; do
  report "$done_scenario"
done
# This run's seconds, and the last known of the scenarios it did not pass.
if [ -f "$durations.new" ]; then
  { cat "$durations.new"
    [ -f "$durations" ] && awk 'NR == FNR {seen[$1] = 1; next} !($1 in seen)' "$durations.new" "$durations"
  } >"$durations.tmp" || true
  mv "$durations.tmp" "$durations"
  rm -f "$durations.new"
fi

if [ ${#failed[@]} -gt 0 ]; then
  log "failed: ${failed[*]}"
  exit 1
fi
log "all scenarios passed: ${scenarios[*]}"
