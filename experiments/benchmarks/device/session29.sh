#!/bin/bash
# Session 29's device call (issue #32), as run: `device.run("bash experiments/benchmarks/device/session29.sh",
# carry=[".gpu"])` after make_site.sh; spy_round.sh and pfl_only.py were in .gpu/ (not kept).
set -u
T0=$(date +%s)
log() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
tar -xJf .gpu/site.tar.xz -C /tmp && python3 -m zipfile -e .gpu/medmnist-3.0.2-py3-none-any.whl /tmp/site || exit 1
mkdir -p /tmp/pyspy && python3 -m zipfile -e .gpu/py_spy-*.whl /tmp/pyspy && SPY=$(find /tmp/pyspy -name py-spy -type f) && chmod +x $SPY
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
clean() { pkill -9 -f raylet; pkill -9 -f gcs_server; pkill -9 -f 'ray::'; pkill -9 -f default_worker; sleep 1; } 2>/dev/null
E=$OUT/errors.txt
nvidia-smi -L; nproc
python3 -c "import torch, ray, pydantic, raysim, medmnist.info; print('torch', torch.__version__, 'ray', ray.__version__, torch.cuda.get_device_name())" || exit 1
log "A/B reduction threads: pfl 4 x 0.25, 60 rounds, 3 pairs"
echo "--- ab" >>$E; timeout 100 python3 experiments/benchmarks/device/reduction_threads_ab.py raysim_vectorized_4x0.25gpu 60 3 2>>$E | tee $OUT/ab.jsonl
clean; log "pfl w2 (20 rounds)"
echo "--- vectorized" >>$E; timeout 200 python3 experiments/benchmarks/gpu_vectorized.py --workload pfl w2 --rounds 20 --data-root /none 2>>$E | tee $OUT/gpu_vectorized.jsonl
clean; log "feddc slice (3 rounds)"
echo "--- feddc" >>$E; timeout 150 python3 experiments/benchmarks/gpu_vectorized.py --workload feddc --rounds 3 2>>$E | tee $OUT/gpu_feddc.jsonl
clean; log "cold start-up"
echo "--- startup" >>$E; timeout 60 python3 experiments/benchmarks/gpu_startup.py --repeats 2 --rounds 3 2>>$E | tee $OUT/gpu_startup.jsonl
clean; log "pfl 4x0.25 steady under py-spy"
timeout 45 bash .gpu/spy_round.sh $SPY /tmp/pfl4.raw raysim_vectorized_4x0.25gpu 250 12 5 2>&1 | grep "profiling\|engine"; gzip -c /tmp/pfl4.raw > $OUT/pfl4.raw.gz
clean; LEFT=$(( 545 - $(date +%s) + T0 ))
if [ $LEFT -gt 40 ]; then log "tests on CUDA ($LEFT s left)"; timeout $LEFT python3 -m pytest -q -p no:cacheprovider -x tests/test_gpu.py tests/test_data_plane.py > $OUT/tests.txt 2>&1; tail -3 $OUT/tests.txt; fi
log done
grep -v "^\s*$" $E | grep -iv "warn\|No GPU" | tail -25
