#!/bin/sh
# Installs the NVIDIA vGPU client configuration token from the VM's licence disk, at boot.
# Installed by the cozystack.gpu.guest_license role, whose unit sets the environment below.
#
# The cozystack.gpu controller gives every VMI of a licensed vGPU class a KubeVirt secret
# disk (an ISO 9660 image holding the token Secret's keys as files) with a fixed serial. This
# finds the disk by that serial, mounts it read-only, copies the token into a directory on a
# memory file system, unmounts it, points gridd.conf at that directory and restarts
# nvidia-gridd. The token is never written to a disk of the guest: a guest started without
# the licence disk (its class lost the licence, its namespace the entitlement, or the image
# was copied elsewhere) has no token.
#
# Exit status 0 when the token was installed or when there is no licence disk (a VM of an
# unlicensed class); 1 when the disk is there and the token could not be installed.
set -u
# The token is copied under this umask and only then given its mode.
umask 077

serial=${COZYSTACK_GPU_LICENSE_SERIAL:-gpu-license}
by_id=${COZYSTACK_GPU_LICENSE_BY_ID_DIR:-/dev/disk/by-id}
key=${COZYSTACK_GPU_LICENSE_TOKEN_KEY:-client_configuration_token.tok}
token_dir=${COZYSTACK_GPU_LICENSE_TOKEN_DIR:-/run/nvidia-licence}
token_mode=${COZYSTACK_GPU_LICENSE_TOKEN_MODE:-0744}
feature_type=${COZYSTACK_GPU_LICENSE_FEATURE_TYPE:-1}
# The controller writes the class's FeatureType beside the token; it wins over the image's.
feature_key=${COZYSTACK_GPU_LICENSE_FEATURE_KEY:-feature-type}
gridd_conf=${COZYSTACK_GPU_LICENSE_GRIDD_CONF:-/etc/nvidia/gridd.conf}
gridd_service=${COZYSTACK_GPU_LICENSE_GRIDD_SERVICE:-nvidia-gridd.service}
settle_timeout=${COZYSTACK_GPU_LICENSE_SETTLE_TIMEOUT:-30}

log() { echo "cozystack-gpu-guest-license: $*" >&2; }

mnt=""
release_disk() {
  [ -n "$mnt" ] || return 0
  # umount can report a failure of what it does after unmounting (freeing a loop device it
  # cannot see, in a container): what counts is whether the disk is still mounted.
  if mountpoint -q "$mnt" && ! umount "$mnt" && mountpoint -q "$mnt"; then
    log "cannot unmount the licence disk from $mnt"
    return 1
  fi
  rmdir "$mnt"
  mnt=""
}
trap release_disk EXIT
trap 'exit 1' INT TERM

# Rewrites gridd.conf only when its content changes: every other line is kept, the first
# ClientConfigTokenPath and FeatureType settings are replaced in place (later duplicates
# dropped, since gridd would read one of them), and missing ones are appended. A guest
# without gridd.conf starts from NVIDIA's template beside it when there is one.
write_gridd_conf() {
  mkdir -p "$(dirname "$gridd_conf")" || return 1
  from=/dev/null
  if [ -f "$gridd_conf" ]; then
    from=$gridd_conf
  elif [ -f "$gridd_conf.template" ]; then
    from=$gridd_conf.template
  fi
  new=$(mktemp "$gridd_conf.XXXXXX") || return 1
  if ! awk -v path="${token_dir%/}/" -v feature="$feature_type" '
    /^[ \t]*ClientConfigTokenPath[ \t]*=/ { if (!p) print "ClientConfigTokenPath=" path; p = 1; next }
    /^[ \t]*FeatureType[ \t]*=/ { if (!f) print "FeatureType=" feature; f = 1; next }
    { print }
    END {
      if (!p) print "ClientConfigTokenPath=" path
      if (!f) print "FeatureType=" feature
    }' "$from" >"$new"; then
    rm -f "$new"
    return 1
  fi
  if [ -f "$gridd_conf" ] && cmp -s "$new" "$gridd_conf"; then
    rm -f "$new"
    return 0
  fi
  chmod 0644 "$new" && mv -f "$new" "$gridd_conf" && log "wrote $gridd_conf"
}

mkdir -p "$token_dir" && chmod 0755 "$token_dir" || exit 1
# On a disk the token would outlive the VM's licence disk (and be baked into every image
# made from this one): only a memory file system keeps the contract.
fs_type=$(stat -f -c %T "$token_dir") || exit 1
case $fs_type in
  tmpfs | ramfs) ;;
  *)
    log "$token_dir is on $fs_type, not a memory file system (tmpfs): not putting the token there"
    exit 1
    ;;
esac
# A token left by an earlier run of this boot goes, whatever the disk holds now.
rm -f "$token_dir/$key"

# The disk is there from the VM's start; wait until udev has made the by-id links of the
# devices found at boot, instead of guessing a delay.
if command -v udevadm >/dev/null 2>&1; then
  udevadm settle --timeout="$settle_timeout" ||
    log "udev did not settle within ${settle_timeout}s; looking for the disk anyway"
fi
disk=$by_id/virtio-$serial
if [ ! -e "$disk" ]; then
  log "no licence disk ($disk is absent): this VM gets no vGPU licence token"
  exit 0
fi

mnt=$(mktemp -d /run/cozystack-gpu-licence-disk.XXXXXX) || exit 1
if ! mount -o ro,nosuid,nodev,noexec "$disk" "$mnt"; then
  log "cannot mount the licence disk $disk read-only"
  exit 1
fi
if [ ! -f "$mnt/$key" ]; then
  log "the licence disk $disk holds no $key (it holds: $(find "$mnt" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | paste -sd ' ' -))"
  exit 1
fi
# Copied beside its final name and renamed, so gridd never reads half a token.
if ! { cp "$mnt/$key" "$token_dir/.$key.new" &&
  chmod "$token_mode" "$token_dir/.$key.new" &&
  mv -f "$token_dir/.$key.new" "$token_dir/$key"; }; then
  rm -f "$token_dir/.$key.new"
  log "cannot copy $key into $token_dir"
  exit 1
fi
if [ -f "$mnt/$feature_key" ]; then
  from_disk=$(tr -d ' \t\r\n' <"$mnt/$feature_key")
  case $from_disk in
    0 | 1 | 2 | 4) feature_type=$from_disk ;;
    *) log "ignoring $feature_key '$from_disk' on the licence disk (not 0, 1, 2 or 4): FeatureType $feature_type" ;;
  esac
fi
status=0
release_disk || status=1
log "installed the vGPU licence token in $token_dir/$key"

if ! write_gridd_conf; then
  log "cannot write $gridd_conf"
  exit 1
fi

# --no-block: gridd is ordered after this unit, so a restart waited for here would wait for
# this unit to finish starting. try-restart: at boot gridd is not running yet and starts after
# this unit with the token in place; on a later run it is restarted to read the new token.
if ! systemctl --no-block try-restart "$gridd_service"; then
  log "could not ask systemd to restart $gridd_service"
fi
exit "$status"
