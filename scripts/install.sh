#!/usr/bin/env bash
# Set up prunetrain on a fresh machine: a virtualenv in .venv with torch and the package (editable) plus test tools.
# Idempotent. PRUNETRAIN_TORCH picks another torch requirement (default torch==2.13.0, the CPU build; on a GPU
# machine use e.g. PRUNETRAIN_TORCH="torch" with the CUDA index of your choice).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
PY=.venv/bin/python
"$PY" -m pip install -q "${PRUNETRAIN_TORCH:-torch==2.13.0}"
"$PY" -m pip install -q -e ".[test]"
"$PY" -c "import torch, transformers, prunetrain; print(f'prunetrain {prunetrain.__version__}: torch {torch.__version__}, transformers {transformers.__version__}')"
