#!/bin/bash
# Wheels of the peers (Flower 1.41 on raysim's Ray, pfl-research 0.6) for a GPU machine that
# has torch, grpcio and typer but no internet, for Python 3.12, into .gpu/peers/ (copied with .gpu/):
#   bash experiments/benchmarks/device/peer_wheels.sh   (after make_site.sh, from the repository root)
# Only what their simulations import and the machine lacks; Flower's pin of ray 2.55.1 is
# replaced by the Ray 2.60 of make_site.sh (its simulation runs on it unchanged).
set -eu
mkdir -p .gpu/peers && rm -f .gpu/peers/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 \
  -d .gpu/peers flwr==1.41.0 "cryptography==50.0.2" cffi pycparser "sqlalchemy==2.1.9" greenlet \
  alembic mako "fastapi==0.138.2" "starlette==1.3.1" annotated-doc "pycryptodome==3.24.1" "iterators==0.0.2" tomli \
  tomli-w grpcio-health-checking "protobuf==6.33.6" \
  pfl==0.6.0 "dp-accounting==0.5.0" prv-accountant multiprocess dill
ls -la .gpu/peers; du -sh .gpu
