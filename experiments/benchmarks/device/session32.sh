#!/bin/bash
# Session 32's device call (issue #32), as run: `device.run("bash experiments/benchmarks/device/session32.sh",
# carry=[".gpu"], timeout_s=440)`, with d6d3e3a's package (before the bytecode cache) in
# .gpu/before/raysim. In priority order: the cold start-up with raysim's bytecode cache
# alternated with d6d3e3a; one cold command under py-spy (every process) with Ray's logs, for
# where the Ray and worker phases go; the pfl per-client loop through Ray against the plain
# loop, twice; pfl at 4 x 0.25 GPU over 20 rounds with each round's seconds, twice; a warm
# cluster's start-up.
set -u
BUDGET=${BUDGET:-420}
source experiments/benchmarks/device/preamble.sh
mkdir -p /tmp/pyspy && python3 -m zipfile -e .gpu/py_spy-*.whl /tmp/pyspy && SPY=$(find /tmp/pyspy -name py-spy -type f) && chmod +x $SPY
nvidia-smi -L; nproc; nvidia-smi -q | grep -i "persistence mode"
python3 -c "import torch, ray, raysim; print('torch', torch.__version__, 'ray', ray.__version__, torch.cuda.get_device_name())" || exit 1
export RAYSIM_CACHE=/tmp/raysim-cache
log "one cold command fills raysim's bytecode cache"
fits 60 fill && timeout 60 python3 $B/gpu_startup.py --repeats 1 --rounds 1 2>$OUT/startup.err | sed 's/^{/{"cache": "filled", /' | tee $OUT/gpu_startup_fill.jsonl
du -sh $RAYSIM_CACHE/bytecode 2>/dev/null
clean; log "cold start-up (pfl, 4 x 0.25 GPU), alternated with d6d3e3a"
fits 100 ab && timeout 150 python3 $B/gpu_startup.py --repeats 2 --rounds 3 --baseline-tree .gpu/before 2>>$OUT/startup.err | tee $OUT/gpu_startup_ab.jsonl
clean; log "a cold command under py-spy (every process), then Ray's logs"
python3 -c "
import sys, yaml; sys.path[:0]=['tests','$B']
from pathlib import Path; from fixtures import write_medmnist_npz; from gpu_startup import pfl_config
write_medmnist_npz(Path('/tmp/pfl'), 'pathmnist', n_train=50000, n_test=200, channels=3, num_classes=9)
Path('/tmp/pfl.yaml').write_text(yaml.safe_dump(pfl_config(Path('/tmp/pfl'), 3, True)))"
fits 40 spy && timeout 50 bash $B/device/spy_every_process.sh $SPY $OUT/cold_command.raw 40 -- python3 -m raysim.cli run /tmp/pfl.yaml --output /tmp/res --no-progress; gzip $OUT/cold_command.raw
tar -czf $OUT/ray_logs.tar.gz -C /tmp/ray/session_latest logs 2>/dev/null; ls -la $OUT/ray_logs.tar.gz
for pass in 1 2; do
  clean; log "pfl per-client loop through Ray against the plain loop, pass $pass"
  fits 60 loop && timeout 80 python3 $B/gpu_vectorized.py --workload pfl --rounds 20 --data-root /none --engines raysim_loop_1gpu --no-plain-in-ray 2>>$OUT/vectorized.err | tee -a $OUT/gpu_pfl_loop.jsonl | cut -c1-300
done
for pass in 1 2; do
  clean; log "pfl 4 x 0.25 GPU over 20 rounds, pass $pass"
  fits 45 quarter && timeout 70 python3 $B/gpu_vectorized.py --workload pfl --rounds 20 --data-root /none --engines raysim_vectorized_4x0.25gpu --no-plain-in-ray 2>>$OUT/vectorized.err | tee -a $OUT/gpu_pfl_quarter.jsonl
done
clean; log "start-up joining a warm cluster (raysim cluster start)"
fits 45 warm && python3 -m raysim.cli cluster start && timeout 40 python3 $B/gpu_startup.py --repeats 2 --rounds 3 2>>$OUT/startup.err | sed 's/^{/{"cluster": "warm", /' | tee $OUT/gpu_startup_warm.jsonl
python3 -m raysim.cli cluster stop
log done
for f in $OUT/*.err; do echo "--- $f"; grep -v "^\s*$" $f | grep -iv "warn" | tail -4; done
