#!/usr/bin/env bash
# veloxquant.torch's tests (python/tests/test_torch.py) on the H200 machine, whose Python has torch and
# transformers but no package registry: libveloxquant_torch.so built on the project machine
# (`scripts/build.sh release veloxquant_torch`) and carried in $T, the Debian libraries it links in
# $P/lib (device_prelude.sh's folder); veloxquant/torch.py goes on PYTHONPATH in a package of its
# own (the nanobind module is not built for that Python: the tests that need it skip).
#   bash bench/cuda/run_torch_tests.sh [pytest args]
set -uo pipefail
P=${VQ_PREBUILT:-.gpubin-d}
T=${VQ_TORCH_PREBUILT:-.gpubin-t}
root=$(mktemp -d)
mkdir -p "$root/veloxquant"
cp python/veloxquant/torch.py "$root/veloxquant/"
: > "$root/veloxquant/__init__.py"
export PYTHONPATH=$root VQ_TORCH_LIB=$PWD/$T/libveloxquant_torch.so LD_LIBRARY_PATH=$PWD/$P/lib:${LD_LIBRARY_PATH:-}
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
python3 -m pytest -q -p no:cacheprovider python/tests/test_torch.py "$@" 2>&1 | tail -25
