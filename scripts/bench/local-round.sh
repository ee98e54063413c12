#!/usr/bin/env bash
# One benchmark round of `kiln-agent local`, the command scripts/bench/harness.py runs for a side:
#
#   scripts/bench/local-round.sh [--fresh] [--keep FILE] AGENT STORE SPEC [AGENT-FLAG...]
#
# runs `AGENT [AGENT-FLAG...] local --output json --store STORE SPEC` and prints its JSON outcome
# (the last line of its stdout) on stdout. --fresh removes STORE first, so the round compiles
# (its compileSeconds is then a compile, not a store hit); --keep copies the outcome to FILE.
# Exit 1, with the reason and the agent's last log lines on stderr, when it is not ready: the
# harness then stops and shows them.
set -euo pipefail
fresh=0 keep=
while [[ ${1:-} == --* ]]; do
  case $1 in
    --fresh) fresh=1; shift ;;
    --keep) keep=${2:?--keep needs a FILE}; shift 2 ;;
    *) echo "local-round.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
(($# >= 3)) || { echo "usage: local-round.sh [--fresh] [--keep FILE] AGENT STORE SPEC [AGENT-FLAG...]" >&2; exit 2; }
agent=$1 store=$2 spec=$3
shift 3
((!fresh)) || rm -rf "$store"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
outcome=$("$agent" "$@" local --output json --store "$store" "$spec" 2>"$log" | tail -1) || true
[[ -z $keep ]] || printf '%s\n' "$outcome" >"$keep"
python3 - "$outcome" <<'PY' || { tail -5 "$log" >&2; exit 1; }
import json, sys
try:
    o = json.loads(sys.argv[1])
except ValueError:
    sys.exit("kiln-agent local gave no outcome")
if not o.get("ready"):
    sys.exit("not ready: %s: %s" % (o.get("reason"), o.get("message")))
PY
printf '%s\n' "$outcome"
