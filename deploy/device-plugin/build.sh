#!/usr/bin/env bash
# Builds NVIDIA's kubevirt-gpu-device-plugin with the vGPU-VF patch of this folder into an
# image, from NVIDIA's source at the release the patch is written against.
#
# Usage: build.sh SOURCE TAG [IMAGE]
#   SOURCE  NVIDIA's source: a clone of github.com/NVIDIA/kubevirt-gpu-device-plugin (the
#           tag's commit is built, not the work tree), the release's source tarball
#           (.tar.gz), or that tarball unpacked
#   TAG     the upstream release: v1.6.0, the only one this patch is written against
#   IMAGE   the reference to tag the image with
#           (default localhost/kubevirt-gpu-device-plugin:TAG-vf)
#
# Environment:
#   CONTAINER_TOOL              podman, buildah or docker (default: the first one found)
#   GOLANG_IMAGE, RUNTIME_IMAGE the Containerfile's base images, e.g. from your mirror
#
# It checks SOURCE is NVIDIA's TAG and that the patch applies before anything is built;
# each refusal says what is wrong and what would fix it. Push the image to your registry
# afterwards and name it in cozystack_gpu_device_plugin_image (docs/install.md).
set -euo pipefail

# The release the patch is written against, and its commit in NVIDIA's repository: a moved
# tag or another project's tree is refused rather than patched.
readonly PINNED_TAG=v1.6.0
readonly PINNED_COMMIT=d26f2374d3c3f4785f52689cf954d1eea6202fb5
readonly IMAGE_NAME=kubevirt-gpu-device-plugin
readonly UPSTREAM=https://github.com/NVIDIA/kubevirt-gpu-device-plugin

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

# The first argument is the message's first line; the others follow it, indented.
die() {
  printf 'build.sh: %s\n' "$1" >&2
  shift
  [ $# -eq 0 ] || printf '  %s\n' "$@" >&2
  exit 1
}

usage() {
  sed -n '5,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

[ $# -ge 2 ] && [ $# -le 3 ] || usage
source=$1
tag=$2
image=${3:-localhost/$IMAGE_NAME:$tag-vf}

if [ "$tag" != "$PINNED_TAG" ]; then
  die "TAG $tag: the patch is written against NVIDIA's $PINNED_TAG and is not known to apply" \
    "to another release. Build $PINNED_TAG (build.sh SOURCE $PINNED_TAG), or port the patch" \
    "to $tag first and pin that tag in this script and the Containerfile."
fi
[ -e "$source" ] || die "SOURCE $source does not exist. Give NVIDIA's source: a clone" \
  "(git clone $UPSTREAM) or the $PINNED_TAG source tarball ($UPSTREAM/archive/refs/tags/$PINNED_TAG.tar.gz)."

patches=("$here"/*.patch)
[ -e "${patches[0]}" ] || die "no *.patch next to $0: the recipe is incomplete; unpack it again."
[ -f "$here/Containerfile" ] || die "no Containerfile next to $0: the recipe is incomplete; unpack it again."

work=$(mktemp -d "${TMPDIR:-/tmp}/device-plugin-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
work=$(cd "$work" && pwd -P)
context=$work/context
mkdir -p "$context/src" "$context/patches"

# The commit a tarball was made from, when git archive (as GitHub's tarballs are) wrote it.
tarball_commit() {
  { gzip -dc "$1" 2>/dev/null || cat "$1" 2>/dev/null; } | git get-tar-commit-id 2>/dev/null || true
}

refuse_commit() {
  die "SOURCE $source: $1 is commit $2, but NVIDIA's $PINNED_TAG is $PINNED_COMMIT." \
    "The tag was moved or SOURCE is not NVIDIA's repository: fetch NVIDIA's tags again" \
    "(git -C SOURCE fetch --force --tags $UPSTREAM) or download NVIDIA's $PINNED_TAG tarball."
}

if [ -d "$source" ] && git -C "$source" rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git -C "$source" rev-parse -q --verify "refs/tags/$tag^{commit}") ||
    die "SOURCE $source has no tag $tag: fetch NVIDIA's tags (git -C SOURCE fetch --tags $UPSTREAM)."
  [ "$commit" = "$PINNED_COMMIT" ] || refuse_commit "its tag $tag" "$commit"
  # The tag's tree, not the work tree: local edits and untracked files never reach the build.
  git -C "$source" archive --format=tar "$commit" | tar -C "$context/src" -xf -
  echo "build.sh: NVIDIA's $tag ($commit) from the clone $source" >&2
elif [ -d "$source" ]; then
  cp -a "$source"/. "$context/src/"
  echo "build.sh: NVIDIA's $tag from the directory $source (no git history: versions.mk checked)" >&2
elif [ -f "$source" ]; then
  commit=$(tarball_commit "$source")
  if [ -n "$commit" ] && [ "$commit" != "$PINNED_COMMIT" ]; then
    refuse_commit "the tarball" "$commit"
  fi
  mkdir "$work/unpacked"
  tar -C "$work/unpacked" -xf "$source" ||
    die "SOURCE $source is neither a directory nor a tarball tar can read: give a clone or NVIDIA's $PINNED_TAG source tarball."
  shopt -s nullglob dotglob
  top=("$work"/unpacked/*)
  shopt -u nullglob dotglob
  # GitHub's tarballs hold one folder, kubevirt-gpu-device-plugin-1.6.0/.
  if [ ${#top[@]} -eq 1 ] && [ -d "${top[0]}" ]; then
    cp -a "${top[0]}"/. "$context/src/"
  else
    cp -a "$work"/unpacked/. "$context/src/"
  fi
  echo "build.sh: NVIDIA's $tag from the tarball $source${commit:+ ($commit)}" >&2
else
  die "SOURCE $source is neither a directory nor a file: give a clone or NVIDIA's $PINNED_TAG source tarball."
fi

found=$(grep -m1 '^VERSION ?= ' "$context/src/versions.mk" 2>/dev/null || true)
if [ "$found" != "VERSION ?= $tag" ]; then
  die "SOURCE $source is not kubevirt-gpu-device-plugin $tag: its versions.mk says" \
    "'${found:-nothing}' where $tag's says 'VERSION ?= $tag'." \
    "Give NVIDIA's $tag source: a clone that has the tag, or the $tag source tarball."
fi

cp "${patches[@]}" "$context/patches/"
cp "$here/Containerfile" "$context/Containerfile"

# A patch that does not apply is refused here, with git's reasons, before any image is pulled.
# The ceiling keeps git from taking a repository above the work folder for this tree.
for patch in "$context"/patches/*.patch; do
  if ! out=$(cd "$context/src" && GIT_CEILING_DIRECTORIES=$work git apply --check "$patch" 2>&1); then
    mapfile -t reasons <<<"$out"
    die "$(basename "$patch") does not apply to SOURCE $source at $tag:" "${reasons[@]}" \
      "SOURCE differs from NVIDIA's $tag (local changes in a directory or tarball?):" \
      "build from a clean clone or NVIDIA's $tag tarball."
  fi
done

if [ -n "${CONTAINER_TOOL:-}" ]; then
  tool=$CONTAINER_TOOL
  command -v "$tool" >/dev/null || die "CONTAINER_TOOL=$tool is not on PATH."
else
  tool=
  for candidate in podman buildah docker; do
    if command -v "$candidate" >/dev/null; then
      tool=$candidate
      break
    fi
  done
  [ -n "$tool" ] || die "none of podman, buildah or docker is on PATH: install podman" \
    "(apt-get install podman) or name a tool in CONTAINER_TOOL."
fi
case $(basename "$tool") in
  buildah*) build=(bud) ;;
  *) build=(build) ;;
esac

args=(--build-arg "UPSTREAM_TAG=$tag")
[ -z "${GOLANG_IMAGE:-}" ] || args+=(--build-arg "GOLANG_IMAGE=$GOLANG_IMAGE")
[ -z "${RUNTIME_IMAGE:-}" ] || args+=(--build-arg "RUNTIME_IMAGE=$RUNTIME_IMAGE")

echo "build.sh: building $image with $tool" >&2
"$tool" "${build[@]}" -f "$context/Containerfile" -t "$image" "${args[@]}" "$context" ||
  die "$tool could not build $image (its output is above)."
echo "build.sh: built $image. Push it where your nodes pull from (podman: $tool push $image" \
  "REGISTRY/gpu/$IMAGE_NAME:$tag-vf) and name that in cozystack_gpu_device_plugin_image." >&2
echo "$image"
