# Sourced by the GPU-machine scripts (peers_gpu.sh) on that machine, from the
# repository root: the carried site unpacked and on PYTHONPATH, and the helpers they share.
# log MSG: a line with the seconds since the start; fits SECONDS STEP: whether that much is
# left of BUDGET (seconds; unset: no budget); clean: end every Ray process between steps.
T0=$(date +%s)
log() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
fits() { [ -z "${BUDGET:-}" ] || [ $(( BUDGET - $(date +%s) + T0 )) -ge "$1" ] || { log "skipped: $2"; return 1; }; }
clean() { pkill -9 -f raylet; pkill -9 -f gcs_server; pkill -9 -f 'ray::'; pkill -9 -f default_worker; sleep 1; } 2>/dev/null
tar -xJf .gpu/site.tar.xz -C /tmp || exit 1
for wheel in .gpu/medmnist-*.whl .gpu/monai-*.whl; do python3 -m zipfile -e "$wheel" /tmp/site || exit 1; done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
B=experiments/benchmarks
