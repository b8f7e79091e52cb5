#!/usr/bin/env bash
# Runs the pytest suite as two pytest processes at once: the tests marked own_plane (those
# that bring their own control plane, the real node or a podman image: the demo, the
# release upgrade, the real-node and image tests, about a quarter of an hour that mostly
# waits on real time and on its own plane) beside the rest, which share the session's plane.
# The two share no API server, node or image, and each fills what the other leaves idle on
# two cores. The own_plane lane's output is shown whole after the other's, so the two do not
# interleave; the script fails when either did.
#
# Usage: tools/pytest-lanes.sh [pytest arguments for both lanes]   (from controller/)
set -uo pipefail

pytest=${PYTEST:-pytest}
log=$(mktemp /tmp/cozystack-gpu-own-plane.XXXXXX)
trap 'rm -f "$log"' EXIT

echo "== pytest: the own_plane tests start in a lane of their own (their output follows) == ($(date -u +%T))" >&2
"$pytest" -p no:cacheprovider -m own_plane "$@" >"$log" 2>&1 &
own=$!

"$pytest" -p no:cacheprovider -m "not own_plane" "$@"
shared=$?

if kill -0 "$own" 2>/dev/null; then
  echo "== pytest: waiting for the own_plane lane == ($(date -u +%T))" >&2
fi
wait "$own"
owned=$?
echo "== pytest: the own_plane lane ==" >&2
cat "$log"
echo "== pytest lanes ended: own_plane exit $owned; the rest exit $shared == ($(date -u +%T))" >&2
[ "$shared" -eq 0 ] && [ "$owned" -eq 0 ]
