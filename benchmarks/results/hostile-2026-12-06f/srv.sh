#!/bin/bash
# usage: srv.sh PORT WORKERS  (env READER LIMIT PERIOD DELAY); writes pid to /tmp/hostile-b/attacks/srv.pid
cd /tmp/hostile-b/attacks
PYTHONPATH=/tmp/hostile-b:/tmp/hostile-b/attacks setsid /work/main/.venv/bin/python -m uvicorn app:app --port $1 --workers $2 --log-level warning $EXTRA > /tmp/hostile-b/attacks/srv.log 2>&1 &
echo $! > /tmp/hostile-b/attacks/srv.pid
for i in $(seq 50); do curl -s -o /dev/null localhost:$1/energy && break; sleep 0.3; done
echo started pid $(cat srv.pid)
