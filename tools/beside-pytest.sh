#!/usr/bin/env bash
# Runs pytest (its two lanes, tools/pytest-lanes.sh) and, beside it at the lowest CPU
# priority, the collection's checks (make sanity units ansible-lint galaxy-import): about
# four minutes of CPU that pytest leaves room for, since much of it waits on its control
# planes and on real time. Niced, the
# checks take only CPU pytest leaves idle, so no test waits longer for them. Their output is
# shown whole after pytest's, so the two do not interleave; the script fails when either did.
#
# Usage: tools/beside-pytest.sh   (from make test; MAKE names the make to call)
set -uo pipefail

make=${MAKE:-make}
log=$(mktemp /tmp/cozystack-gpu-checks.XXXXXX)
trap 'rm -f "$log"' EXIT

echo "== the collection's checks start beside pytest, niced (their output follows pytest's) == ($(date -u +%T))" >&2
nice -n 19 "$make" --no-print-directory sanity units ansible-lint galaxy-import >"$log" 2>&1 &
checks=$!

"$make" --no-print-directory pytest
tests=$?

if kill -0 "$checks" 2>/dev/null; then
  echo "== pytest done; waiting for the collection's checks == ($(date -u +%T))" >&2
fi
wait "$checks"
checked=$?
echo "== the collection's checks (ran beside pytest) ==" >&2
cat "$log"
echo "== the collection's checks ended: exit $checked; pytest: exit $tests == ($(date -u +%T))" >&2
[ "$tests" -eq 0 ] && [ "$checked" -eq 0 ]
