#!/bin/bash
# Hostile35 H1 repro: fresh uvicorn --workers 2 on port 9513, 3 warm-up requests, then bursts of 12 x 120 ms.
cd /work/hostile35-scripts
GW_NODE=h35r$$ nohup /work/hostile35/.venv/bin/uvicorn gwa:app --port 9513 --workers 2 > /tmp/h35_repro.log 2>&1 &
UV=$!
sleep 6
for i in 1 2 3; do curl -s -o /dev/null -XPOST localhost:9513/v1/chat/completions -H 'content-type: application/json' -d '{"work_s":0.3}'; sleep 0.5; done
sleep 2
for i in 1 2 3 4; do
  /work/hostile35/.venv/bin/python burst_b.py http://127.0.0.1:9513 12 0.12 neuralwatt > /tmp/h35_r$i.txt
  echo "burst $i: avg_power_watts $(grep -o '"avg_power_watts": [0-9.a-z]*' /tmp/h35_r$i.txt | awk '{print int($2)}' | sort -n | sed -n '1p;$p' | tr '\n' ' ')| energy_joules $(grep -o '"energy_joules": [0-9.a-z]*' /tmp/h35_r$i.txt | awk '{printf "%.1f\n", $2}' | sort -n | sed -n '1p;$p' | tr '\n' ' ')| settled mean_watts $(grep -o 'settled W [0-9.]*' /tmp/h35_r$i.txt | awk '{print $3}' | sort -n | sed -n '1p;$p' | tr '\n' ' ')| settled alloc $(grep -o 'alloc [0-9.]*' /tmp/h35_r$i.txt | awk '{print $2}' | sort -n | sed -n '1p;$p' | tr '\n' ' ')"
  sleep 2
done
kill -TERM $UV; sleep 2
