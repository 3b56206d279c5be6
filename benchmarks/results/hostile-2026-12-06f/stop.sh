#!/bin/bash
p=$(cat /tmp/hostile-b/attacks/srv.pid); kill -TERM -- -$p 2>/dev/null; sleep 2; kill -KILL -- -$p 2>/dev/null; echo stopped $p
