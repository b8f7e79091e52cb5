#!/bin/sh
# Makes the guest_license scenario's stand-in disks (molecule only): a licence disk holding
# the token under the role's default key and the class's FeatureType (2), as a KubeVirt
# secret disk holds the Secret copy's keys as files, and a disk holding something else. ext2 images made without mounting
# anything; the kernel here has no isofs for KubeVirt's ISO 9660.
# Usage: make-licence-disks.sh LICENCE_IMAGE OTHER_IMAGE TOKEN
set -eu

licence_image=$1
other_image=$2
token=$3

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/licence" "$work/other"
printf '%s\n' "$token" >"$work/licence/client_configuration_token.tok"
# The controller's copy carries the class's FeatureType beside the token.
printf '2' >"$work/licence/feature-type"
printf 'not a token\n' >"$work/other/other.txt"
mke2fs -q -t ext2 -L cfgdata -d "$work/licence" "$licence_image" 1M
mke2fs -q -t ext2 -L cfgdata -d "$work/other" "$other_image" 1M
