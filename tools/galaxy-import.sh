#!/usr/bin/env bash
# Runs galaxy-importer, the checks Galaxy runs when a collection is uploaded, on a built
# collection tarball, offline. Fails when Galaxy would refuse the upload (a role without a
# README, a broken galaxy.yml or changelog, a plugin it cannot load).
#
# Usage: tools/galaxy-import.sh cozystack-gpu-X.Y.Z.tar.gz
# The importer lives in a venv of its own (requirements/galaxy-importer.txt), made once per
# machine for a given requirements file under ~/.cache/cozystack-gpu.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
tarball=$(realpath "${1:?usage: $0 COLLECTION_TARBALL}")
python=${COZYSTACK_GPU_PYTHON:-python3.11}
key=$(sha256sum "$repo/requirements/galaxy-importer.txt" | cut -c1-12)
venv=${XDG_CACHE_HOME:-$HOME/.cache}/cozystack-gpu/galaxy-importer-$key
if [ ! -f "$venv/.complete" ]; then
  echo "[galaxy-import] installing galaxy-importer into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r "$repo/requirements/galaxy-importer.txt"
  touch "$venv/.complete"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# The importer calls ansible-doc and ansible-lint by name: its own, from its venv.
if ! PATH="$venv/bin:$PATH" GALAXY_IMPORTER_CONFIG="$here/galaxy-importer.cfg" \
  "$venv/bin/python" -m galaxy_importer.main "$tarball" >"$work/log" 2>&1; then
  cat "$work/log" >&2
  echo "[galaxy-import] Galaxy would refuse $(basename "$tarball")" >&2
  exit 1
fi
grep -E '^(ERROR|WARNING)' "$work/log" >&2 || true
# An ansible-doc error is not a refusal, but Galaxy then shows those plugins undocumented.
"$venv/bin/python" - "$work/importer_result.json" <<'PY' >&2
import json, sys
contents = json.load(open(sys.argv[1]))["contents"]
bare = [c["name"] for c in contents if c["content_type"] == "module" and not c.get("doc_strings")]
if bare:
    print(f"[galaxy-import] WARNING: Galaxy would show these modules without documentation: {bare}")
PY
echo "[galaxy-import] $(basename "$tarball"): $(tail -n1 "$work/log")" >&2
