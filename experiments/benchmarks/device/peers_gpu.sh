#!/bin/bash
# raysim on one GPU machine, in two commands held to time budgets of 370 and 420 s (BUDGET;
# a step that would not fit is skipped and logged), the second right after the first:
#   PART=1 BUDGET=370 bash experiments/benchmarks/device/peers_gpu.sh
#     both peer shapes over 20 rounds: raysim eager and compiled (engine.compile_step), on the
#     whole card and on 4 x 0.25 of it, beside Flower, pfl-research (1, 2 and 4 processes), the
#     plain loop and the on-device reference, with a py-spy profile of raysim's driver and
#     workers on each shape (records: $OUT/peers_gpu.jsonl, stacks: $OUT/stacks.txt)
#   PART=2 BUDGET=420 bash experiments/benchmarks/device/peers_gpu.sh
#     the tests that use the GPU (the compiled step's first), a round of each task (U-Net, TCN)
#     vectorised against the per-client loop and a plain loop ($OUT/task_rounds_gpu.jsonl), and
#     `raysim estimate` of the paper-scale configs with a GPU probe on stand-in data (one CSV per
#     config in $OUT/estimates.tar; its stderr in $OUT/estimates.log)
#   PART=3 BUDGET=300 bash experiments/benchmarks/device/peers_gpu.sh   (where time is left)
#     120 rounds of both shapes beside pfl-research's 4 processes, and raysim against the
#     reference over 20 rounds in three alternating repeats
# From the repository root on the GPU machine, with the .gpu/ folder that make_site.sh and
# peer_wheels.sh build beside it; back here, `python experiments/benchmarks/device/unpack.py
# FOLDER` files what came back (records, estimates) and re-renders BENCHMARKS.md. Each step has its own time limit and is skipped when the
# call's BUDGET (seconds) would not hold it; the first compiled call's limits include its
# compile time.
set -u
BUDGET=${BUDGET:-370}
source experiments/benchmarks/device/preamble.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/peers/*.whl \
  2>&1 | grep -v "already exists" | tail -3
nvidia-smi -L; nproc
python3 -c "import torch, ray, flwr, pfl, monai, raysim; print('torch', torch.__version__, 'ray', ray.__version__, 'flwr', flwr.__version__, 'pfl', pfl.__version__, 'monai', monai.__version__, torch.cuda.get_device_name())" || exit 1
R=$OUT/peers_gpu.jsonl
S=$OUT/stacks.txt
P="python3 $B/peers.py --flower-python python3 --pfl-python python3 --records $R"
ENGINES="raysim_vectorized_1gpu raysim_compiled_1gpu raysim_vectorized_4x0.25gpu raysim_compiled_4x0.25gpu"
python3 -m pip install -q --no-index --no-deps --target /tmp/spy .gpu/py_spy-*.whl && SPY=/tmp/spy/bin/py-spy
case "${PART:-1}" in
1)
log "pfl shape, 20 rounds: every side, then raysim 4 x 0.25 GPU under py-spy"
fits 220 pfl20 && timeout 220 $P --workloads cnn-1000x50-cifar-shape --rounds 20 --engines $ENGINES --pfl-processes 1 2 4 --timeout 75 --profile $S --py-spy ${SPY:-py-spy} 2>$OUT/pfl20.err | cut -c1-230
clean; log "w2 shape, 20 rounds: every side, then raysim 4 x 0.25 GPU under py-spy"
fits 130 w220 && timeout 130 $P --workloads convnet32-150x8-pneumonia --rounds 20 --engines $ENGINES --pfl-processes 1 2 4 --timeout 50 --profile $S --py-spy ${SPY:-py-spy} 2>$OUT/w220.err | cut -c1-230
;;
2)
log "tests that use the GPU, the compiled step's first"
fits 100 tests && timeout 100 python3 -m pytest -p no:cacheprovider -n 0 --timeout 90 tests/test_compiled_step.py tests/test_gpu.py > $OUT/tests.txt 2>&1; tail -3 $OUT/tests.txt
clean; log "a round of each task on the GPU: raysim's loop and vectorised path against a plain loop"
fits 45 tasks && timeout 45 python3 $B/task_rounds.py --device cuda --rounds 3 --repeats 3 --records $OUT/task_rounds_gpu.jsonl | cut -c1-230
clean; log "paper-scale configs estimated with a GPU probe on stand-in data"
mkdir -p /tmp/estimates /tmp/nodata
estimate() {  # seconds, config path, then estimate's options
  local limit=$1 config=$2; shift 2
  local name; name=$(basename "$config" .yaml)
  fits "$limit" "estimate $name" || return
  log "estimate $name"
  timeout "$limit" python3 -m raysim estimate "$config" --stand-in-data --data-root /tmp/nodata \
    --csv "/tmp/estimates/${name}_gpu.csv" "$@" 2>>$OUT/estimates.log | tail -4
  clean
}
# the new tasks first, then FedDC's Table 1, MH-pFLID's Table 2, FedVCK; the polyp rounds and
# FedVCK's condensation iterations extended along the line through two probes (an estimate
# stopped at its limit still projects and writes the variants it probed)
estimate 90 experiments/segmentation/polyp_table4_paper_scale.yaml --variant fedavg --variant mhpflid --rounds 2 --extrapolate dataset.train_subset=32,96
estimate 45 experiments/mhpflid/sleep_edf_paper_scale.yaml --variant mhpflid --rounds 2
estimate 40 experiments/feddc/pneumonia_paper.yaml --variant feddc --rounds 11
estimate 40 experiments/mhpflid/paper_scale.yaml --variant mhpflid --rounds 2
estimate 50 experiments/fedvck/paper_scale.yaml --variant fedvck --rounds 2 --extrapolate algorithm.iterations=50,250
# where time is left: FedSM's segmentation studies and its RetinaMNIST config
estimate 60 experiments/segmentation/polyp_two_hospitals_paper_scale.yaml --variant fedavg --variant fedsm --rounds 2 --extrapolate dataset.train_subset=32,96
estimate 40 experiments/segmentation/polyp_unseen_site_paper_scale.yaml --variant fedsm --rounds 2
estimate 40 experiments/fedsm/fedsm_paper_scale.yaml --variant fedsm --rounds 2
tar -cf $OUT/estimates.tar -C /tmp estimates
;;
3)
log "120 rounds: raysim, pfl-research's best process count, the reference (not Flower, not the plain loop)"
fits 160 r120 && timeout 160 $P --workloads cnn-1000x50-cifar-shape convnet32-150x8-pneumonia --rounds 120 --pfl-processes 4 --skip flower plain_pytorch_loop --engines $ENGINES --timeout 50 2>$OUT/r120.err | cut -c1-230
clean; log "pfl shape, 20 rounds: raysim against the reference, three alternating repeats"
fits 120 repeats && timeout 130 python3 $B/peers.py --records $R --workloads cnn-1000x50-cifar-shape --rounds 20 --repeats 3 --skip flower plain_pytorch_loop --engines $ENGINES --timeout 40 2>$OUT/repeats.err | cut -c1-230
;;
esac
log done
for f in $OUT/*.err; do [ -e "$f" ] || continue; echo "--- $f"; grep -v "^\s*$" $f | grep -iv "warn" | tail -4; done
