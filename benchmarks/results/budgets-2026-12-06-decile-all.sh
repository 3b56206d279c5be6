#!/bin/bash
# The upper-decile reservation against the mean's: arms interleaved, old = d3080f6 (in /tmp/oldd),
# new = /work/main's tree. The runs of budgets-2026-12-06-cold-run.sh, warm (3 warm-up requests)
# and cold, 300 J and 50 J. usage: bash decile-all.sh FIRST_PORT
cd "$(dirname "$0")/../.."
S=benchmarks/results/budgets-2026-12-06-cold-run.sh
P=${1:-9700}
run() {  # limit warmup run arm
  if [ "$4" = old ]; then PP=/tmp/oldd; else PP=$(pwd); fi
  echo "limit=$1 warmup=$2 run=$3 arm=$4 port=$P start=$(date -u +%H:%M:%S) load=$(cut -d' ' -f1 /proc/loadavg)"
  timeout 200 unshare -m bash $S 8 $P "$PP" "$1" "$2"
  P=$((P+1))
}
for n in 1 2 3; do run 300 3 $n old; run 300 3 $n new; done
for n in 1 2; do run 300 0 $n old; run 300 0 $n new; done
for n in 1 2; do run 50 0 $n old; run 50 0 $n new; done
