#!/bin/bash
# Session 31's second device call (issue #32), as run: `device.run("bash experiments/benchmarks/device/session31b.sh",
# carry=[".gpu"], timeout_s=240)`: where a worker's imports go, where the per-client loop's
# time goes on the GPU, and W2's throughput lines the first call lost (ray.init twice).
set -u
BUDGET=${BUDGET:-220}
source experiments/benchmarks/device/preamble.sh
env | grep -i "^PYTHON" ; log "import chain of a worker process"
fits 50 imports && timeout 50 python3 $B/device/import_times.py --slowest 15 2>$OUT/imports.err | tee $OUT/import_times.jsonl | cut -c1-400
log "per-client loop on cuda, profiled"
fits 60 per_client && timeout 60 python3 $B/per_client_overhead.py --workloads pfl W2 --rounds 5 --vectorize never --profile 30 --data-root /none 2>$OUT/per_client.err | tee $OUT/per_client_profile.jsonl | cut -c1-300
clean; log "w2 (20 rounds): loop and 4 x 0.25, with the plain loop in a Ray worker"
fits 50 vectorized && timeout $(( BUDGET - $(date +%s) + T0 - 3 )) python3 $B/gpu_vectorized.py --workload w2 --rounds 20 --data-root /none --engines raysim_loop_1gpu raysim_vectorized_4x0.25gpu 2>$OUT/vectorized.err | tee $OUT/gpu_vectorized_w2.jsonl
log done
for f in $OUT/*.err; do echo "--- $f"; grep -v "^\s*$" $f | grep -iv "warn" | tail -4; done
