#!/usr/bin/env bash
# Runs ansible-test on this collection. ansible-test needs the collection at a path ending
# in ansible_collections/cozystack/gpu, so the tracked and untracked-but-not-ignored files
# are copied there first. It also downloads get-pip from the internet to build the virtual
# environments of its sanity tests; a local stand-in that uses ensurepip serves it instead.
#
# Usage: tools/ansible-test.sh sanity --python 3.11 [more ansible-test arguments]
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

# ansible-test skips its shellcheck test with only a warning when the program is missing, so
# the collection's shell scripts would go unchecked: sanity installs Debian's package first.
if [ "${1:-}" = sanity ] && ! command -v shellcheck >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "[ansible-test] shellcheck is missing and installing it needs root:" \
      "run 'apt-get install shellcheck' as root, then this again" >&2
    exit 1
  fi
  echo "[ansible-test] installing shellcheck" >&2
  # The lock timeout lets this wait for another apt run on the machine instead of failing.
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends shellcheck >/dev/null
fi

venv=${COZYSTACK_GPU_VENV:-$repo/.venv}
root=${COZYSTACK_GPU_COLLECTIONS_ROOT:-$repo/.cache/collections}
dest=$root/ansible_collections/cozystack/gpu

# ansible-test looks for this exact cache file before downloading get-pip 24.2.
shim_dir=$HOME/.ansible/test/cache
mkdir -p "$shim_dir"
cat > "$shim_dir/get_pip_24_2.py.new" <<'PY'
"""Offline stand-in for get-pip.py: bootstrap pip with ensurepip, then install the rest."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
if args:
    subprocess.check_call([sys.executable, "-m", "pip", "install", *args])
PY
mv "$shim_dir/get_pip_24_2.py.new" "$shim_dir/get_pip_24_2.py"

rm -rf "$dest"
mkdir -p "$dest"
(
  cd "$repo"
  # The Helm chart's templates are Go templates that render YAML, not YAML (yamllint cannot
  # parse "{{- if ... }}"): they are the chart's, checked by `helm lint --strict` and the
  # chart tests (controller/tests/chart), not Ansible content for ansible-test to lint. So
  # are its alerting rules (files/alerts.yaml, rendered by `tpl`; promtool checks them).
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' path; do
      case $path in controller/chart/templates/* | controller/chart/files/alerts.yaml) continue ;; esac
      [ -e "$path" ] || [ -L "$path" ] && printf '%s\0' "$path"
    done |
    tar --null --no-recursion -T - -cf - | tar -C "$dest" -xf -
)

# ansible-test finds the collections ours depends on (galaxy.yml) only in the same
# collection root; Galaxy is unreachable, so link the copies the ansible package installed.
site_collections=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ansible_collections
for dependency in $("$venv/bin/python" -c 'import sys, yaml; print(*yaml.safe_load(open(sys.argv[1]))["dependencies"])' "$repo/galaxy.yml"); do
  link=$root/ansible_collections/${dependency/.//}
  mkdir -p "$(dirname "$link")"
  ln -sfn "$site_collections/${dependency/.//}" "$link"
done

cd "$dest"
# A git repository makes ansible-test list files the way CI sees them.
git init -q . && git add -A >/dev/null && git -c user.name=ci -c user.email=ci@localhost commit -qm snapshot

export PATH="$venv/bin:$PATH"
exec "$venv/bin/ansible-test" "$@"
