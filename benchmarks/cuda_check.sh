#!/usr/bin/env bash
# The CUDA path in one go, on a machine with an NVIDIA GPU and this checkout (run from the repository root; nothing is
# installed: the checkout is put on PYTHONPATH). Each step is bounded and a failed step does not stop the next:
#   1. the main recipe's smoke preset on CUDA (the Trainer picks the GPU; bf16 autocast where the GPU supports it):
#      masks, a mid-training shrink, BLEU over training, report, benchmark;
#   2. the training-step speed of the main job's two architectures (FULL_DIR, 144 heads; PRUNED_DIR, 36), CUDA bf16,
#      interleaved (benchmarks/bench_recipe_train_speed.py): the recipe's batch (64, eager attention as the recipe
#      runs it), then sdpa, then a GPU-sized batch of 256. The models get fresh weights (benchmarks/fresh_weights.py),
#      so the two directories need only their configs, layouts and tokenizers; 2b. the same two layouts at
#      Transformer-base widths (d_model 512, FFN 2048), batches of 64 and 256;
#   3. with MAIN_SECONDS > 0: the main job itself, `prunetrain recipe wmt-small-deen`, cut after MAIN_SECONDS;
#   4. the compress recipe's smoke preset on CUDA (`wmt-small-deen-compress --smoke`: distillation from a frozen
#      teacher on the GPU while the student is pruned and shrunk), from a smoke run of the main recipe with pruning
#      off as its starting model.
#   5. the training step profiled on CUDA (benchmarks/profile_recipe_step.py, bf16, eager): at the recipe's width and
#      batch, at Transformer-base widths with batches of 256, 1024 and 4096 — kernel time by op, how busy the GPU is,
#      kernels launched — for the arms PROFILE_ARMS names (default: the full model, the main job's 36 heads, and the
#      fast recipe's FFN arms 144+ffn50 and 36+ffn50) with PROFILE_VARIANTS' loss and optimizer (default fused+fused,
#      what the recipes' Trainer runs), medians of PROFILE_REPEATS rounds (default 3);
#   6. the fast recipe's smoke preset on CUDA (`wmt-small-deen-fast --smoke`: heads and FFN neurons masked, shrunk
#      mid-training on the GPU, BLEU, report, benchmark).
# STEPS="2b 4" runs only the steps named (default: 1 2 2b 3 4 5 6). Output in OUT: cuda_check.log (versions, every
# step's output), smoke_report.md, speed_*.json, speed_base_*.json, main_report.md, compress_smoke_report.md,
# profile_*.json, fast_smoke_report.md. FULL_DIR and PRUNED_DIR are read by steps 2 and 2b only.
#
#   bash benchmarks/cuda_check.sh OUT DATA_DIR FULL_DIR PRUNED_DIR [MAIN_SECONDS]
#   STEPS="2b 4" bash benchmarks/cuda_check.sh OUT DATA_DIR FULL_DIR PRUNED_DIR
set -uo pipefail
out=$1 data=$2 full=$3 pruned=$4 main_seconds=${5:-0}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)
log="$out/cuda_check.log"
step() { echo "== $(date -u +%T) $*" | tee -a "$log"; }
steps=" ${STEPS:-1 2 2b 3 4 5 6} "
wanted() { [[ "$steps" == *" $1 "* ]]; }

step "versions"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, transformers, sys; print(sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'bf16', torch.cuda.is_bf16_supported())"
  nproc; } >> "$log" 2>&1

if wanted 1; then
  step "1. smoke recipe on CUDA"
  timeout 240 python -m prunetrain recipe wmt-small-deen --smoke --data-dir "$data" --output "$work/smoke" >> "$log" 2>&1
  echo "rc=$?" >> "$log"
  cp "$work/smoke/report.md" "$out/smoke_report.md" 2>> "$log"
fi

# speed_pair TAG SECONDS "FRESH_WEIGHTS_OPTIONS" "BATCH ATTN"...: fresh weights of both layouts (widened by the
# options), then one interleaved training-step comparison per setting, into $out/speed${TAG}_bBATCH_ATTN.json
speed_pair() {
  local tag=$1 seconds=$2 widen=$3 setting
  shift 3
  python benchmarks/fresh_weights.py "$full" "$work/full$tag" $widen >> "$log" 2>&1
  python benchmarks/fresh_weights.py "$pruned" "$work/pruned$tag" $widen >> "$log" 2>&1
  for setting in "$@"; do
    set -- $setting
    timeout "$seconds" python benchmarks/bench_recipe_train_speed.py "$work/full$tag" "$work/pruned$tag" \
      --data-dir "$data" --device cuda --precision bf16 --batch "$1" --attn "$2" --out "$out/speed${tag}_b$1_$2.json" \
      >> "$log" 2>&1
    echo "rc=$?" >> "$log"
  done
}

if wanted 2; then
  step "2. training-step speed, full vs pruned, CUDA bf16"
  speed_pair "" 120 "" "64 eager" "64 sdpa" "256 eager"
fi

if wanted 2b; then
  step "2b. the same two layouts at Transformer-base widths (d_model 512, FFN 2048: the recipe's GPU setting)"
  speed_pair _base 150 "--d-model 512 --ffn-dim 2048" "64 eager" "256 eager" "256 sdpa"
fi

if wanted 4; then
  step "4. the compress recipe's smoke preset on CUDA (distillation from a teacher on the GPU)"
  timeout 240 python -m prunetrain recipe wmt-small-deen --smoke --data-dir "$data" --set 'pruning.schedule_steps={}' \
    --set 'pruning.shrink_steps=[]' --output "$work/full_smoke" >> "$log" 2>&1
  echo "rc=$?" >> "$log"
  timeout 240 python -m prunetrain recipe wmt-small-deen-compress --smoke --data-dir "$data" \
    --set "model.init_from=$work/full_smoke" --output "$work/compress_smoke" >> "$log" 2>&1
  echo "rc=$?" >> "$log"
  cp "$work/compress_smoke/report.md" "$out/compress_smoke_report.md" 2>> "$log"
fi

if wanted 3 && [ "$main_seconds" -gt 0 ]; then
  step "3. the main job on CUDA, cut after $main_seconds s"
  timeout "$main_seconds" python -m prunetrain recipe wmt-small-deen --data-dir "$data" --output "$work/main" \
    >> "$log" 2>&1
  echo "rc=$?" >> "$log"
  cp "$work/main/report.md" "$out/main_report.md" 2>> "$log"
fi

if wanted 5; then
  step "5. the training step profiled on CUDA, bf16: kernel time by op, GPU busy, kernels launched"
  for size in ${PROFILE_SIZES:-64x256x1024 256x512x2048 1024x512x2048 4096x512x2048}; do  # batch x d_model x FFN
    IFS=x read -r batch width ffn <<< "$size"
    timeout 170 python benchmarks/profile_recipe_step.py --device cuda --precisions bf16 \
      --repeats "${PROFILE_REPEATS:-3}" --batch "$batch" --d-model "$width" --ffn-dim "$ffn" --data-dir "$data" \
      --arms "${PROFILE_ARMS:-144,36 shrunk,144+ffn50,36+ffn50}" --variants "${PROFILE_VARIANTS:-fused+fused}" \
      --out "$out/profile_b${batch}_d$width.json" >> "$log" 2>&1
    echo "rc=$?" >> "$log"
  done
fi

if wanted 6; then
  step "6. the fast recipe's smoke preset on CUDA (heads and FFN neurons masked and shrunk on the GPU)"
  timeout 240 python -m prunetrain recipe wmt-small-deen-fast --smoke --data-dir "$data" --output "$work/fast_smoke" \
    >> "$log" 2>&1
  echo "rc=$?" >> "$log"
  cp "$work/fast_smoke/report.md" "$out/fast_smoke_report.md" 2>> "$log"
fi
step "done"
