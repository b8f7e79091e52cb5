#!/usr/bin/env bash
# Copies into the chart (controller/chart/files) what is written once elsewhere:
#   - the package's CRDs (controller/cozystack_gpu/crds), rendered as templates;
#   - the controller's RBAC (controller/deploy/rbac.yaml, kept beside the code and tested
#     with it), whose rules the chart's ClusterRole and Role take.
#
# Copies, not links: helm cannot read outside a chart's directory, and it reports every link
# it follows on each install; a packaged chart must carry the files themselves. A chart test
# (tests/chart/test_chart_render.py) fails while a copy differs and names this script.
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
cp "$repo/controller/deploy/rbac.yaml" "$dst/controller-rbac.yaml"
echo "[sync-chart-files] CRDs and controller RBAC copied into $dst" >&2
