#!/bin/bash
# Session 32's second device call (issue #32), as run: `device.run("bash experiments/benchmarks/device/session32b.sh",
# carry=[".gpu"], timeout_s=410)`, with d37231d's package (before one gather per client and
# round) in .gpu/base32/raysim. The CUDA tests on this tree; the pfl per-client loop through Ray
# against the plain loop, alternated with d37231d, two pairs; then two more cold starts with
# the bytecode cache (after the command that fills it).
set -u
BUDGET=${BUDGET:-380}
source experiments/benchmarks/device/preamble.sh
python3 -c "import torch, ray, raysim; print('torch', torch.__version__, 'ray', ray.__version__, torch.cuda.get_device_name())" || exit 1
log "tests on CUDA"
fits 90 tests && timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_data_plane.py > $OUT/tests.txt 2>&1; tail -3 $OUT/tests.txt
for pass in 1 2; do
  clean; log "pfl loop through Ray against the plain loop, pass $pass: this tree"
  fits 55 this && timeout 70 python3 $B/gpu_vectorized.py --workload pfl --rounds 20 --data-root /none --engines raysim_loop_1gpu --no-plain-in-ray 2>>$OUT/vectorized.err | sed 's/^{/{"tree": "this", /' | tee -a $OUT/gpu_pfl_loop_ab.jsonl | cut -c1-260
  clean; log "pass $pass: d37231d"
  fits 55 base && PYTHONPATH=/tmp/site:$PWD/.gpu/base32:$PWD timeout 70 python3 $B/gpu_vectorized.py --workload pfl --rounds 20 --data-root /none --engines raysim_loop_1gpu --no-plain-in-ray 2>>$OUT/vectorized.err | sed 's/^{/{"tree": "d37231d", /' | tee -a $OUT/gpu_pfl_loop_ab.jsonl | cut -c1-260
done
clean; export RAYSIM_CACHE=/tmp/raysim-cache
log "cold start-up with the bytecode cache: the filling command, then two"
fits 25 fill && timeout 40 python3 $B/gpu_startup.py --repeats 1 --rounds 1 2>$OUT/startup.err | sed 's/^{/{"cache": "filled", /' | tee $OUT/gpu_startup_fill.jsonl
clean; fits 22 startup && timeout $(( BUDGET - $(date +%s) + T0 - 2 )) python3 $B/gpu_startup.py --repeats 2 --rounds 3 2>>$OUT/startup.err | tee $OUT/gpu_startup.jsonl
log done
for f in $OUT/*.err; do echo "--- $f"; grep -v "^\s*$" $f | grep -iv "warn" | tail -3; done
