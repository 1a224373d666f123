#!/bin/bash
# raysim, Flower 1.41, pfl-research 0.6, the plain loop and the on-device reference on one GPU
# machine, as two commands of about 7.5 minutes each: PART=1, both shapes over 20 rounds (with a
# py-spy profile of raysim's driver and workers on each) and three seeds merged or not; PART=2,
# 120 rounds, raysim against the on-device reference over 20 rounds in three alternating repeats,
# and the tests that use the GPU. From the repository root on the GPU machine, with the
# .gpu/ folder that make_site.sh and peer_wheels.sh build beside it (both commands' records go
# into one records file):
#   PART=1 BUDGET=450 bash experiments/benchmarks/device/peers_gpu.sh
#   PART=2 BUDGET=450 bash experiments/benchmarks/device/peers_gpu.sh
# Records (JSON lines of peers.py) and logs land in $OUT; each step has its own time limit and
# is skipped when the call's BUDGET (seconds) would not hold it.
set -u
BUDGET=${BUDGET:-550}
source experiments/benchmarks/device/preamble.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/peers/*.whl \
  2>&1 | grep -v "already exists" | tail -3
nvidia-smi -L; nproc
python3 -c "import torch, ray, flwr, pfl, raysim; print('torch', torch.__version__, 'ray', ray.__version__, 'flwr', flwr.__version__, 'pfl', pfl.__version__, torch.cuda.get_device_name())" || exit 1
R=$OUT/peers_gpu.jsonl
S=$OUT/stacks.txt
P="python3 $B/peers.py --flower-python python3 --pfl-python python3 --records $R"
python3 -m pip install -q --no-index --no-deps --target /tmp/spy .gpu/py_spy-*.whl && SPY=/tmp/spy/bin/py-spy
if [ "${PART:-1}" = 1 ]; then
log "pfl shape, 20 rounds: every side, then raysim 4 x 0.25 GPU under py-spy"
fits 250 pfl20 && timeout 250 $P --workloads cnn-1000x50-cifar-shape --rounds 20 --engines raysim_vectorized_1gpu raysim_compiled_1gpu raysim_vectorized_4x0.25gpu raysim_compiled_4x0.25gpu --pfl-processes 1 2 4 --timeout 75 --profile $S --py-spy ${SPY:-py-spy} 2>$OUT/pfl20.err | cut -c1-230
clean; log "w2 shape, 20 rounds: every side, then raysim 4 x 0.25 GPU under py-spy"
fits 150 w220 && timeout 200 $P --workloads convnet32-150x8-pneumonia --rounds 20 --engines raysim_vectorized_1gpu raysim_compiled_1gpu raysim_vectorized_4x0.25gpu raysim_compiled_4x0.25gpu --pfl-processes 1 2 4 --timeout 60 --profile $S --py-spy ${SPY:-py-spy} 2>$OUT/w220.err | cut -c1-230
clean; log "three seeds on one card, merge_seeds auto and never"
fits 60 seeds && timeout 90 $P --workloads --seeds-check --timeout 80 2>$OUT/seeds.err | grep seeds | cut -c1-230
else
log "120 rounds: raysim, pfl-research's best process count, the reference (not Flower, not the plain loop)"
fits 170 r120 && timeout 170 $P --workloads cnn-1000x50-cifar-shape convnet32-150x8-pneumonia --rounds 120 --pfl-processes 4 --skip flower plain_pytorch_loop --engines raysim_vectorized_1gpu raysim_compiled_1gpu raysim_vectorized_4x0.25gpu raysim_compiled_4x0.25gpu --timeout 50 2>$OUT/r120.err | cut -c1-230
clean; log "pfl shape, 20 rounds: raysim against the reference, three alternating repeats"
fits 120 repeats && timeout 130 python3 $B/peers.py --records $R --workloads cnn-1000x50-cifar-shape --rounds 20 --repeats 3 --skip flower plain_pytorch_loop --engines raysim_vectorized_1gpu raysim_compiled_1gpu raysim_vectorized_4x0.25gpu raysim_compiled_4x0.25gpu --timeout 40 2>$OUT/repeats.err | cut -c1-230
clean; log "tests that use the GPU"
fits 40 tests && timeout $(( BUDGET - $(date +%s) + T0 - 5 )) python3 -m pytest -p no:cacheprovider --timeout 120 tests/test_gpu.py tests/test_compiled_step.py tests/test_merged_seeds.py tests/test_memory_format.py tests/test_data_plane.py tests/test_engine.py > $OUT/tests.txt 2>&1; tail -3 $OUT/tests.txt
fi
log done
for f in $OUT/*.err; do echo "--- $f"; grep -v "^\s*$" $f | grep -iv "warn" | tail -4; done
