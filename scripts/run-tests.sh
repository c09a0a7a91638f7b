#!/usr/bin/env bash
# Runs the Criterion suite given as arguments, streaming its output, and
# repeats what failed just above the summary line, so that the tail of a
# long CI log says which test failed and why. The summary stays last.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
    echo "---- failed (repeated from above):"
    grep -E '^\[(FAIL|----)\]' "$log" | grep -v 'Test is disabled'
    grep -E '^\[====\] Synthesis' "$log" | tail -n 1
fi
exit "$rc"
