#!/bin/bash
# Session 31's first device call (issue #32), as run: `device.run("bash experiments/benchmarks/device/session31.sh",
# carry=[".gpu"], timeout_s=420)` after make_site.sh, with d6a32b8's package in .gpu/before/raysim.
# Steps in priority order; each is skipped when less than its limit is left of BUDGET seconds.
set -u
BUDGET=${BUDGET:-390}
source experiments/benchmarks/device/preamble.sh
nvidia-smi -L; nproc
python3 -c "import torch, ray, pydantic, raysim, medmnist.info; print('torch', torch.__version__, 'ray', ray.__version__, torch.cuda.get_device_name())" || exit 1
log "cold start-up, alternated with the baseline tree (pfl, 4 x 0.25 GPU)"
fits 110 startup && timeout 110 python3 $B/gpu_startup.py --repeats 2 --rounds 3 --baseline-tree .gpu/before 2>$OUT/startup.err | tee $OUT/gpu_startup.jsonl
clean; log "cold start-up timeline"
fits 45 timeline && { timeout 45 python3 $B/device/startup_timeline.py 2>>$OUT/startup.err > $OUT/startup_timeline.jsonl; grep -c IDLE $OUT/startup_timeline.jsonl; tail -1 $OUT/startup_timeline.jsonl; }
clean; log "per-client loop against the plain loop in one process (no Ray), cuda"
fits 70 per_client && timeout 70 python3 $B/per_client_overhead.py --workloads pfl W2 --rounds 7 --vectorize never --data-root /none 2>$OUT/vectorized.err | tee $OUT/per_client_cuda.jsonl
clean; log "pfl w2 (20 rounds): loop and 4 x 0.25, with the plain loop in a Ray worker"
fits 60 vectorized && timeout $(( BUDGET - $(date +%s) + T0 - 5 )) python3 $B/gpu_vectorized.py --workload pfl w2 --rounds 20 --data-root /none --engines raysim_loop_1gpu raysim_vectorized_4x0.25gpu 2>>$OUT/vectorized.err | tee $OUT/gpu_vectorized.jsonl
log done
for f in $OUT/*.err; do echo "--- $f"; grep -v "^\s*$" $f | grep -iv "warn" | tail -5; done
