#!/bin/bash
# The device checks of issue #32 (session 24): run from the repository root on the lent
# machine after make_site.sh here, e.g. device.run("bash experiments/benchmarks/device/checks.sh throughput",
# carry=[".gpu"], timeout_s=560). Steps in priority order, each under its own limit; JSON lines
# and logs land in $OUT. With a raysim package of another commit under .gpu/before/raysim
# (`git worktree add /tmp/b COMMIT; cp -r /tmp/b/raysim .gpu/before/`), the per-client loop is
# also measured on that tree in the same call (before/after on one machine).
# `checks.sh [throughput|startup|feddc|all]` (default all): each group fits one call of
# 600 s; all of them together may not, so a short lease runs the groups it needs most.
set -u
source experiments/benchmarks/device/preamble.sh
nvidia-smi -L; nproc
python3 -c "import torch, ray, pydantic, raysim, medmnist.info; print('torch', torch.__version__, 'ray', ray.__version__, torch.cuda.get_device_name())" || exit 1
GROUP=${1:-all}
want() { [ "$GROUP" = all ] || [ "$GROUP" = "$1" ]; }
if want throughput; then
log "pfl w2 (20 rounds)"
timeout 230 python3 experiments/benchmarks/gpu_vectorized.py --workload pfl w2 --rounds 20 --data-root /none 2>$OUT/vectorized.err | tee $OUT/gpu_vectorized.jsonl
clean; log "per-client loop against the plain loop in one process (no Ray)"
timeout 120 python3 experiments/benchmarks/per_client_overhead.py --workloads pfl W2 --rounds 9 --vectorize never --data-root /none 2>>$OUT/vectorized.err | tee $OUT/per_client_cuda.jsonl
if [ -d .gpu/before/raysim ]; then
  clean; log "per-client loop on the baseline tree"
  PYTHONPATH=/tmp/site:$PWD/.gpu/before:$PWD timeout 150 python3 experiments/benchmarks/gpu_vectorized.py --workload pfl w2 --rounds 20 --data-root /none --engines raysim_loop_1gpu 2>>$OUT/vectorized.err | sed 's/^{/{"tree": "baseline", /' | tee $OUT/gpu_loop_baseline.jsonl
fi
fi
if want startup; then
clean; log "one cold command first: where torch keeps no bytecode, it fills raysim's bytecode cache"
timeout 60 python3 experiments/benchmarks/gpu_startup.py --repeats 1 --rounds 1 2>$OUT/startup.err | sed 's/^{/{"cache": "filled", /' | tee $OUT/gpu_startup_fill.jsonl
clean; log "cold start-up (pfl, 4 x 0.25 GPU)"
if [ -d .gpu/before/raysim ]; then  # cold commands alternated with the baseline tree
  timeout 140 python3 experiments/benchmarks/gpu_startup.py --repeats 2 --rounds 3 --baseline-tree .gpu/before 2>>$OUT/startup.err | tee $OUT/gpu_startup.jsonl
else
  timeout 80 python3 experiments/benchmarks/gpu_startup.py --repeats 2 --rounds 5 2>>$OUT/startup.err | tee $OUT/gpu_startup.jsonl
fi
clean; log "a worker's import chain with and without bytecode"
timeout 45 python3 experiments/benchmarks/bytecode_cache.py --repeats 2 2>>$OUT/startup.err | tee $OUT/bytecode_cache.jsonl
clean; log "cold start-up timeline (the worker processes Ray starts, and when)"
timeout 60 python3 experiments/benchmarks/device/startup_timeline.py 2>>$OUT/startup.err > $OUT/startup_timeline.jsonl; grep -c IDLE $OUT/startup_timeline.jsonl; tail -1 $OUT/startup_timeline.jsonl
clean; log "start-up joining a warm cluster (raysim cluster start)"
python3 -m raysim.cli cluster start && timeout 60 python3 experiments/benchmarks/gpu_startup.py --repeats 2 --rounds 5 2>>$OUT/startup.err | sed 's/^{/{"cluster": "warm", /' | tee -a $OUT/gpu_startup.jsonl
python3 -m raysim.cli cluster stop
fi
if want feddc; then
clean; log "feddc slice (5 rounds; the loop and the batched BatchNorm path)"
timeout 300 python3 experiments/benchmarks/gpu_vectorized.py --workload feddc --rounds 5 2>$OUT/feddc.err | tee $OUT/gpu_feddc.jsonl
clean; log "tests on CUDA"
timeout 75 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_data_plane.py > $OUT/tests.txt 2>&1; tail -4 $OUT/tests.txt
fi
log done
for f in $OUT/*.err; do echo "--- $f"; grep -v "^\s*$" $f | tail -6; done
