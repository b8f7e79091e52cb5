#!/usr/bin/env bash
# The chart's alerting rules as the chart renders them with its default values
# (controller/chart/files/alerts.yaml through templates/alerts.yaml), checked by promtool:
# `promtool check rules`, then `promtool test rules` with controller/tests/alerts/*.yaml.
# Needs helm and promtool from tools/build-binaries.sh (COZYSTACK_GPU_BIN_DIR, or the
# directory .cache/bin-dir names) and a Python with PyYAML ($PYTHON).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/versions.env"
bin_dir=${COZYSTACK_GPU_BIN_DIR:-$(cat "$repo/.cache/bin-dir")}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin_dir/helm" template cozystack-gpu "$repo/controller/chart" --kube-version "$KUBERNETES_VERSION" \
  --set metrics.prometheusRule.enabled=true --show-only templates/alerts.yaml |
  "$python" -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(sys.stdin)["spec"], sys.stdout)' \
    >"$work/alerts.yaml"
"$bin_dir/promtool" check rules "$work/alerts.yaml"
# The tests read their rules as "alerts.yaml", next to them.
tests=()
for f in "$repo"/controller/tests/alerts/*_test.yaml; do
  cp "$f" "$work/"
  tests+=("$work/$(basename "$f")")
done
"$bin_dir/promtool" test rules "${tests[@]}"
