#!/usr/bin/env bash
# Set up prunetrain on a fresh machine: a virtualenv in .venv with torch and the package (editable) plus test tools.
# Idempotent. Options:
#   --with-fairseq   also the fairseq extra: fairseq-fixed built against the installed torch (no build isolation,
#                    otherwise pip fetches a CUDA torch into the build env), then torchaudio removed (it breaks
#                    transformers imports here).
#   --with-llama     also the llama extra: gguf and llama-cpp-python, which builds llama.cpp from source for the CPU
#                    (portable: GGML_NATIVE=OFF; only the libraries the Python bindings load: no tests, examples,
#                    tools, server or multimodal library). Measured: ~5 CPU-minutes (9 min wall on a busy 2-core
#                    machine); pip caches the built wheel, so a second install takes seconds.
# The libraries are installed at the versions in scripts/constraints.txt (those the suite was run against);
# PRUNETRAIN_CONSTRAINTS names another constraints file (/dev/null: the newest releases).
# PRUNETRAIN_TORCH picks another torch requirement (default torch==2.13.0, the CPU build; on a GPU machine use e.g.
# PRUNETRAIN_TORCH="torch" with the CUDA index of your choice).
set -euo pipefail
cd "$(dirname "$0")/.."
with_fairseq=0
with_llama=0
for arg in "$@"; do
  case "$arg" in
    --with-fairseq) with_fairseq=1 ;;
    --with-llama) with_llama=1 ;;
    *) echo "install.sh: unknown option '$arg' (allowed: --with-fairseq, --with-llama)" >&2; exit 2 ;;
  esac
done
[ -x .venv/bin/python ] || python3 -m venv .venv
PY=.venv/bin/python
constraints="${PRUNETRAIN_CONSTRAINTS:-scripts/constraints.txt}"
[ -r "$constraints" ] || { echo "install.sh: PRUNETRAIN_CONSTRAINTS='$constraints' is not a readable file" >&2; exit 2; }
"$PY" -m pip install -q "${PRUNETRAIN_TORCH:-torch==2.13.0}"
"$PY" -m pip install -q -c "$constraints" -e ".[test]"
if [ "$with_fairseq" = 1 ]; then
  if ! "$PY" -c "import fairseq" >/dev/null 2>&1; then
    "$PY" -m pip install -q setuptools cython numpy wheel
    "$PY" -m pip install -q --no-build-isolation fairseq-fixed==0.12.3.1
  fi
  "$PY" -m pip uninstall -y -q torchaudio >/dev/null 2>&1 || true
  "$PY" -c "import fairseq, transformers; from transformers import MarianMTModel; print('fairseq', fairseq.__version__)"
fi
if [ "$with_llama" = 1 ]; then
  if ! "$PY" -c "import gguf, llama_cpp" >/dev/null 2>&1; then
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
      "$PY" -m pip install -q -c "$constraints" -e ".[llama]"
  fi
  "$PY" -c "import gguf, llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
fi
"$PY" -c "import torch, transformers, prunetrain; print(f'prunetrain {prunetrain.__version__}: torch {torch.__version__}, transformers {transformers.__version__}')"
