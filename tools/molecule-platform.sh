#!/usr/bin/env bash
# Prepares this machine to run the collection's molecule scenarios without Docker:
# podman + runc, a containers.conf that runc accepts, and a systemd-capable Debian image
# built once by debootstrap (no registry is reachable here) and imported into podman.
#
# Idempotent and quick when done before: packages already installed are not reinstalled,
# containers.conf is rewritten only when its content differs, and the image is built only
# when `podman image exists` says it is missing. The image tag is derived from everything
# that goes into it, so changing the package list builds a new image and never reuses a
# stale one.
#
# Prints the image reference on its last line (tools/molecule-test.sh reads it).
#
# Usage: tools/molecule-platform.sh [molecule|python-base]
#   molecule     (default) the systemd image the molecule scenarios boot
#   python-base  a plain Debian bookworm with python3 3.11 and its venv module: the local
#                stand-in for the official python:3.11-slim base of controller/Containerfile
#                (tools/build-image.sh), since no registry is reachable from this machine
set -euo pipefail

log() { echo "[molecule-platform] $*" >&2; }

target=${1:-molecule}
case "$target" in
  molecule | python-base) ;;
  *)
    echo "[molecule-platform] unknown image '$target': molecule or python-base" >&2
    exit 2
    ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "[molecule-platform] must run as root (apt-get, /etc/containers, rootful podman)" >&2
  exit 1
fi

suite=bookworm
if [ "$target" = molecule ]; then
  # initramfs-tools and grub-common let the vfio role's handlers and drop-ins be exercised;
  # systemd/dbus give a real PID 1 for the boot restore unit; kmod gives modprobe.
  image_packages=python3,systemd,systemd-sysv,dbus,kmod,grub-common,udev,initramfs-tools
  image_name=localhost/cozystack-gpu-molecule
else
  # What the official python image offers a Containerfile: python3 with venv and ensurepip
  # (Debian ships those apart from python3). bookworm's python3 is 3.11, as the package needs.
  image_packages=python3,python3-venv
  image_name=localhost/cozystack-gpu-python-base
fi
tag_source="$suite variant=minbase include=$image_packages format=1"
image_tag="$suite-$(printf '%s' "$tag_source" | sha256sum | cut -c1-12)"
image_ref="$image_name:$image_tag"

# --- packages -------------------------------------------------------------------------------
missing=()
for pkg in podman runc debootstrap; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
else
  log "podman, runc and debootstrap already installed"
fi

# --- containers.conf ------------------------------------------------------------------------
# crun fails on this kind of machine (setrlimit, hybrid cgroups); runc works. The ulimits keep
# systemd in the container from tripping over the host's defaults.
conf=/etc/containers/containers.conf
want_conf='# Written by tools/molecule-platform.sh (cozystack.gpu molecule platform).
[containers]
default_ulimits = ["nproc=4096:4096", "nofile=20000:20000"]

[engine]
runtime = "runc"
'
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$(printf '%s' "$want_conf")" ]; then
  if [ -f "$conf" ] && ! grep -q 'tools/molecule-platform.sh' "$conf"; then
    cp -p "$conf" "$conf.before-cozystack-gpu"
    log "kept the previous $conf as $conf.before-cozystack-gpu"
  fi
  mkdir -p /etc/containers
  printf '%s' "$want_conf" >"$conf"
  log "wrote $conf"
else
  log "$conf already as needed"
fi

# --- image ----------------------------------------------------------------------------------
mirror_from_apt() {
  # The Debian mirror this machine's apt already uses (deb822 .sources or one-line lists);
  # the security archive is skipped because debootstrap needs the main one.
  local uri
  uri=$(
    {
      grep -hE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
      grep -hE '^\s*deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        sed -E 's/^\s*deb\s+(\[[^]]*\]\s+)?//' | awk '{print $1}'
    } | grep -E '/debian/?$' | grep -v security | head -n1
  )
  echo "${uri:-http://deb.debian.org/debian}"
}

if podman image exists "$image_ref"; then
  log "image $image_ref already built"
else
  mirror=${COZYSTACK_GPU_DEBIAN_MIRROR:-$(mirror_from_apt)}
  log "building $image_ref by debootstrap from $mirror (about a minute or two)"
  rootfs=$(mktemp -d /var/tmp/cozystack-gpu-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  start=$SECONDS
  debootstrap --variant=minbase --include="$image_packages" "$suite" "$rootfs" "$mirror" \
    >"$rootfs.log" 2>&1 || {
    tail -n 30 "$rootfs.log" >&2
    exit 1
  }
  rm -f "$rootfs.log"
  if [ "$target" = molecule ]; then
    # A container has no consoles or udev-managed hardware; these units only slow boot and
    # log failures. The machine id is generated at first boot of each container.
    for unit in getty@tty1.service serial-getty@.service systemd-udev-trigger.service \
      systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
      apt-daily.timer apt-daily-upgrade.timer; do
      chroot "$rootfs" systemctl mask "$unit" >/dev/null 2>&1 || true
    done
    : >"$rootfs/etc/machine-id"
    changes=(--change 'CMD ["/lib/systemd/systemd"]' --change 'ENV container=podman')
  else
    changes=(--change 'CMD ["python3"]')
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import "${changes[@]}" - "$image_ref" >/dev/null
  log "imported $image_ref in $((SECONDS - start)) s"
fi

echo "$image_ref"
