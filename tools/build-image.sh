#!/usr/bin/env bash
# Builds the controller image (controller/Containerfile) with podman, once per machine for a
# given set of inputs, and prints its reference on the last line.
#
# No registry is reachable from this machine, and TLS to the package index fails inside
# containers here (see TESTING.md), so the build differs from a hoster's only in its inputs:
#   - the base is a debootstrapped Debian bookworm with python3 3.11 and venv
#     (tools/molecule-platform.sh python-base) instead of the official python:3.11-slim;
#   - the wheels are built on the host, pinned by requirements/dev.txt, and handed to the
#     build in its context (pip --no-index --find-links), never copied into a layer.
# The tag is a hash of everything that goes in (Containerfile, package sources, wheels, base
# image ID), so a change rebuilds and an unchanged tree reuses the image.
#
# Usage: tools/build-image.sh            (needs root: rootful podman, apt-get on a first run)
# Environment: COZYSTACK_GPU_IMAGE_BASE  use this base image instead of the local one
#              COZYSTACK_GPU_IMAGE_KEEP_OTHERS  keep earlier builds (a release's build)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
log() { echo "[build-image] $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "[build-image] must run as root (rootful podman)" >&2
  exit 1
fi

python=${COZYSTACK_GPU_PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=python3.11
cache=${XDG_CACHE_HOME:-$HOME/.cache}/cozystack-gpu/image
mkdir -p "$cache"
# One build at a time per machine: pytest and make may both ask for the image.
exec 8>"$cache/.lock"
flock 8

if [ -n "${COZYSTACK_GPU_IMAGE_BASE:-}" ]; then
  base=$COZYSTACK_GPU_IMAGE_BASE
  "$here/molecule-platform.sh" python-base >/dev/null # still installs podman and its config
else
  base=$("$here/molecule-platform.sh" python-base | tail -n1)
fi
base_id=$(podman image inspect --format '{{.Id}}' "$base")

# --- wheels, built on the host ---------------------------------------------------------------
# Runtime dependencies and the build backend from pyproject.toml, plus grpcio-tools for the
# protos, each at the version requirements/dev.txt pins (the one the tests run against).
mapfile -t requirements < <(
  "$python" - "$repo/controller/pyproject.toml" <<'EOF'
import sys, tomllib
meta = tomllib.load(open(sys.argv[1], "rb"))
for req in meta["project"]["dependencies"] + meta["build-system"]["requires"]:
    print(req)
print("grpcio-tools")
EOF
)
grpcio_tools=$(grep -iE '^grpcio-tools==' "$repo/requirements/dev.txt" || true)
[ -n "$grpcio_tools" ] || grpcio_tools="grpcio-tools"
version=$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$repo/controller/pyproject.toml")
wheel_key=$(printf '%s\n' "${requirements[@]}" | cat - "$repo/requirements/dev.txt" | sha256sum | cut -c1-12)
wheels=$cache/wheels-$wheel_key
if [ ! -f "$wheels/.complete" ]; then
  log "building wheels into $wheels"
  rm -rf "$wheels"
  mkdir -p "$wheels"
  "$python" -m pip wheel --quiet --wheel-dir "$wheels" --constraint "$repo/requirements/dev.txt" \
    "${requirements[@]}"
  touch "$wheels/.complete"
fi

# --- build context -----------------------------------------------------------------------------
context=$(mktemp -d /var/tmp/cozystack-gpu-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
# Tracked and new files alike, never what git ignores (generated protos, caches).
(
  cd "$repo/controller"
  {
    echo pyproject.toml
    echo gen_protos.py
    echo Containerfile
    git ls-files --cached --others --exclude-standard -- cozystack_gpu
  } | sort -u | while read -r path; do
    [ -f "$path" ] || continue # deleted in the work tree but still in the index
    mkdir -p "$context/$(dirname "$path")"
    cp -p "$path" "$context/$path"
  done
)
cp -al "$wheels" "$context/wheels" 2>/dev/null || cp -a "$wheels" "$context/wheels"
rm -f "$context/wheels/.complete"

inputs_hash=$(
  {
    (cd "$context" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
    echo "base=$base_id grpcio_tools=$grpcio_tools version=$version format=1"
  } | sha256sum | cut -c1-12
)
image_name=localhost/cozystack-gpu-controller
image_ref=$image_name:$version-$inputs_hash

if podman image exists "$image_ref"; then
  log "image $image_ref already built"
else
  log "building $image_ref from $base"
  start=$SECONDS
  podman build --quiet --pull=never --file "$context/Containerfile" \
    --build-arg "BASE_IMAGE=$base" \
    --build-arg "PIP_INSTALL_ARGS=--no-index --find-links /context/wheels" \
    --build-arg "GRPCIO_TOOLS=$grpcio_tools" \
    --build-arg "VERSION=$version" \
    --tag "$image_ref" "$context" >/dev/null
  log "built $image_ref in $((SECONDS - start)) s"
  # The builder stage is left untagged (about 435 MB a build): only its layers' cache.
  podman image prune --force --filter label=org.cozystack.gpu.stage=build >/dev/null 2>&1 || true
  # Earlier builds of this image are only disk now; a release build (tools/release.py sets
  # COZYSTACK_GPU_IMAGE_KEEP_OTHERS) leaves the tree's test image alone.
  if [ -z "${COZYSTACK_GPU_IMAGE_KEEP_OTHERS:-}" ]; then
    for old in $(podman images --format '{{.Repository}}:{{.Tag}}' "$image_name"); do
      [ "$old" = "$image_ref" ] || podman rmi "$old" >/dev/null 2>&1 || true
    done
  fi
fi

echo "$image_ref"
