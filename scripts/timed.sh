#!/usr/bin/env bash
# timed.sh LABEL COMMAND: run COMMAND, then print how long it took (CI reads these
# lines to see where its 90 minutes go).
label=$1; shift
start=$SECONDS
bash -c "$*"
rc=$?
printf '== %s: %s in %d s\n' "$label" "$([ $rc = 0 ] && echo passed || echo FAILED)" $((SECONDS - start))
exit $rc
