#!/bin/bash
# Session 31's third device call (issue #32), as run: `device.run("bash experiments/benchmarks/device/session31c.sh",
# carry=[".gpu"], timeout_s=320)`, with d676051's package in .gpu/head/raysim: the per-client
# loop's change (no rebinding on a GPU, index_select) alternated with the tree before it, the
# pfl loop through Ray, and a worker's imports and a cold command with torch's bytecode compiled.
set -u
BUDGET=${BUDGET:-285}
source experiments/benchmarks/device/preamble.sh
SITE=$(python3 -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
python3 -c "import torch, importlib.util as u, os; print('bytecode of torch/__init__ exists:', os.path.exists(u.cache_from_source(torch.__file__)), '| dynamo:', os.path.exists(u.cache_from_source(os.path.join(os.path.dirname(torch.__file__), '_dynamo', 'convert_frame.py'))), '| site writable:', os.access('$SITE/torch', os.W_OK))"
for pass in 1 2; do
  log "per-client loop on cuda, pass $pass: this tree, then d676051"
  fits 25 this && timeout 45 python3 $B/per_client_overhead.py --workloads pfl W2 --rounds 5 --vectorize never --data-root /none 2>>$OUT/per_client.err | sed 's/^{/{"tree": "this", /' | tee -a $OUT/per_client_ab.jsonl
  fits 25 head && PYTHONPATH=/tmp/site:$PWD/.gpu/head:$PWD timeout 45 python3 $B/per_client_overhead.py --workloads pfl W2 --rounds 5 --vectorize never --data-root /none 2>>$OUT/per_client.err | sed 's/^{/{"tree": "d676051", /' | tee -a $OUT/per_client_ab.jsonl
done
log "pfl loop through Ray (20 rounds)"
fits 70 vectorized && timeout 85 python3 $B/gpu_vectorized.py --workload pfl --rounds 20 --data-root /none --engines raysim_loop_1gpu 2>$OUT/vectorized.err | tee $OUT/gpu_vectorized_pfl_loop.jsonl
clean; log "torch and its imports compiled to bytecode under a cache prefix"
fits 60 compile && { timeout 60 env PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m compileall -q -j 16 $SITE/torch $SITE/sympy $SITE/mpmath $SITE/numpy $SITE/networkx $SITE/jinja2 $SITE/filelock $SITE/fsspec /tmp/site >/dev/null 2>&1; log "compiled"; }
fits 40 imports && PYTHONPYCACHEPREFIX=/tmp/pyc timeout 40 python3 $B/device/import_times.py --slowest 6 --together 5 2>$OUT/imports.err | tee $OUT/import_times_compiled.jsonl | cut -c1-250
clean; log "cold start-up with the bytecode"
fits 35 startup && PYTHONPYCACHEPREFIX=/tmp/pyc timeout $(( BUDGET - $(date +%s) + T0 - 2 )) python3 $B/gpu_startup.py --repeats 2 --rounds 3 2>$OUT/startup.err | tee $OUT/gpu_startup_compiled.jsonl
log done
for f in $OUT/*.err; do echo "--- $f"; grep -v "^\s*$" $f | grep -iv "warn" | tail -3; done
