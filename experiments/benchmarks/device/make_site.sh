#!/bin/bash
# Build what raysim needs on a GPU machine (Python 3.12, torch there, no Ray, no internet)
# into .gpu/ (git-ignored via .git/info/exclude; copy it to the GPU machine with the tree), small
# enough to copy alongside the tree (under 64 MiB with the peers' wheels): Ray 2.60 without
# jars/rllib/tune/serve/data/train/llm/tests and with its binaries stripped (104 MB -> a 27 MB xz tarball), plus jsonschema, pydantic,
# medmnist (only its INFO table is used), MONAI (the segmentation networks and losses) and py-spy for
# profiles. Byte-compiled for 3.12.
#   bash experiments/benchmarks/device/make_site.sh   (from the repository root; needs python3.12)
set -eu
if [ -z "${PY:-}" ]; then  # a Python 3.12 that runs (a pyenv shim may not)
  for candidate in python3.12 ~/.pyenv/versions/3.12*/bin/python3.12; do
    if "$candidate" -c "" 2>/dev/null; then PY=$candidate; break; fi
  done
fi
[ -n "${PY:-}" ] || { echo "make_site.sh needs Python 3.12 (set PY=...)"; exit 2; }
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu/wheels .gpu/site && mkdir -p .gpu/wheels
download() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  "$@"; }
download -d .gpu/wheels ray==2.60.0 jsonschema referencing jsonschema-specifications rpds-py \
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection
$PY -m pip install -q --no-index --no-deps --no-compile --target .gpu/site .gpu/wheels/*.whl
cd .gpu/site/ray
rm -rf jars rllib tune serve data train llm dashboard/client air/examples
find . -name tests -type d -prune -exec rm -rf {} +
strip core/src/ray/raylet/raylet core/src/ray/gcs/gcs_server _raylet.so
cd ../..
# byte-compiled for the device's Python, as `pip install` would: otherwise every process of a
# cold command (the CLI, Ray's agents, each worker) compiles Ray's sources it imports
"$PY" -m compileall -q -j 0 site
tar -cJf site.tar.xz site && rm -rf site wheels
python3 -m pip download -q --no-deps --only-binary=:all: -d . medmnist==3.0.2 monai==1.6.1
download -d . py-spy
ls -la
