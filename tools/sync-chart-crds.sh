#!/usr/bin/env bash
# Copies the package's CRDs (controller/cozystack_gpu/crds, the one place they are written)
# into the chart (controller/chart/files), which helm renders as templates.
#
# Copies, not links: helm cannot read outside a chart's directory, and it reports every link
# it follows on each install; a packaged chart must carry the files themselves. A chart test
# (tests/chart/test_chart_render.py) fails while the two differ and names this script.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
src=$repo/controller/cozystack_gpu/crds
dst=$repo/controller/chart/files

sync_dir() { # from, to
  mkdir -p "$2"
  rm -f "$2"/*.yaml
  cp "$1"/*.yaml "$2"/
}
sync_dir "$src" "$dst/crds"
sync_dir "$src/extra" "$dst/crds-extra"
echo "[sync-chart-crds] $(ls "$dst/crds" "$dst/crds-extra" | grep -c yaml) CRDs copied into $dst" >&2
