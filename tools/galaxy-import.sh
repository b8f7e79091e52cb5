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
# The importer goes on past an ansible-doc error, and Galaxy then shows the plugin
# undocumented (an extended fragment of another collection did that: the importer runs
# ansible-doc on this collection alone). Both fail here.
if grep -qE '^ERROR' "$work/log"; then
  echo "[galaxy-import] the importer reported errors (above): Galaxy would show them" >&2
  exit 1
fi
if ! "$venv/bin/python" - "$work/importer_result.json" <<'PY' >&2
import json, sys
docs = json.load(open(sys.argv[1]))["docs_blob"]["contents"]
bare = [c["content_name"] for c in docs if c["content_type"] == "module" and not c["doc_strings"]]
if bare:
    print(f"[galaxy-import] Galaxy would show these modules without documentation: {bare}")
    sys.exit(1)
PY
then
  exit 1
fi
echo "[galaxy-import] $(basename "$tarball"): $(tail -n1 "$work/log")" >&2
