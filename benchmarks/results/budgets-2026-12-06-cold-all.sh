#!/bin/bash
# The runs of budgets-2026-12-06-cold.md, arms interleaved: old = 1bf54f9 (extracted to /tmp/oldb),
# new = this tree. usage: bash budgets-2026-12-06-cold-all.sh FIRST_PORT   (ports FIRST_PORT..+15)
#   mkdir -p /tmp/oldb && git archive 1bf54f9 giul_asgi | tar -x -C /tmp/oldb
cd "$(dirname "$0")/../.."
S=benchmarks/results/budgets-2026-12-06-cold-run.sh
P=${1:-9660}
run() {  # limit warmup run arm
  if [ "$4" = old ]; then PP=/tmp/oldb; else PP=$(pwd); fi
  echo "limit=$1 warmup=$2 run=$3 arm=$4 port=$P start=$(date -u +%H:%M:%S) load=$(cut -d' ' -f1 /proc/loadavg)"
  timeout 200 unshare -m bash $S 8 $P "$PP" "$1" "$2"
  P=$((P+1))
}
for LIMIT in 50 300; do for n in 1 2 3; do run $LIMIT 0 $n old; run $LIMIT 0 $n new; done; done
for n in 1 2; do run 300 3 $n old; run 300 3 $n new; done  # the warm control (3 warm-up requests)
