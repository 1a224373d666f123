#!/bin/bash
# Session 29's second device call (issue #32): start-up joining a warm cluster, and a cold
# command's timeline. `device.run("bash experiments/benchmarks/device/session29_startup.sh", carry=[".gpu"])`
set -u
T0=$(date +%s)
log() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
tar -xJf .gpu/site.tar.xz -C /tmp && python3 -m zipfile -e .gpu/medmnist-3.0.2-py3-none-any.whl /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
log "warm cluster start"
python3 -m raysim.cli cluster start 2>&1 | tail -1
log "pfl start-up joining the warm cluster, 3 commands"
timeout 75 python3 experiments/benchmarks/gpu_startup.py --repeats 3 --rounds 3 2>$OUT/warm.err | sed 's/^{/{"cluster": "warm", /' | tee $OUT/gpu_startup_warm.jsonl
python3 -m raysim.cli cluster stop 2>&1 | tail -1
log "cold timeline"
timeout 45 python3 experiments/benchmarks/device/startup_timeline.py > $OUT/timeline.jsonl 2>&1; tail -2 $OUT/timeline.jsonl | cut -c1-600
log done
tail -3 $OUT/warm.err
