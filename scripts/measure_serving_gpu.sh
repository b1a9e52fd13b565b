#!/usr/bin/env bash
# Serving, eval and latency of clef-flash-shaped releases on one GPU, with the reports written to bench/results.
#
# Usage: scripts/measure_serving_gpu.sh [STEP ...]      (no STEP: every flash step, in this order)
#
#   releases  random clef-flash-shaped bf16 weights, and their FP8_DYNAMIC, NVFP4A16 and NVFP4 releases
#   fp8       FP8_DYNAMIC in the invariant default (split-free), batched, and vLLM's batch-invariant mode;
#             clef-systemone at 1, 8 and 64 clients
#   profile   where FP8_DYNAMIC's time goes, invariant and batched profiled side by side (single requests and
#             one call over the whole workload)
#   schemes   bf16, NVFP4A16 and NVFP4 in the invariant default and batched
#   native    vLLM's own Clef class (vLLM 0.33 or later, no plugin) beside the plugin, on the FP8_DYNAMIC release
#   eval      clef-quant eval --device cuda: the seven fixture tasks, bf16 against FP8_DYNAMIC and NVFP4A16
#   latency   the five Flide-shaped workloads one request at a time, bf16 and FP8_DYNAMIC
#
# Two steps run only when named (their folders are 55 and 64 GB: put WORK on a disk or /dev/shm that holds them):
#   clef      the 27B's shapes: FP8_DYNAMIC with and without the per-layer Gated DeltaNet graphs, then bf16, each
#             workload profiled
#   omni      Clef-Omni at full size: quantized with fp8-block on the GPU (its summary, with time and peak memory,
#             kept as a report), inspected with the engines' rows, and one latency run
#
# Environment: WORK (release folders and eval data; default ./gpu-work), RESULTS (reports; default bench/results),
# TAG (report name suffix; default the GPU's name, e.g. h200), ENGINE_ARGS (extra flags for every engine, e.g.
# "--engine-arg gpu_memory_utilization=0.5"), CLEF_QUANT (the command; default clef-quant), DRY_RUN=1 (print the
# commands, run nothing). A step that needs a release folder assumes `releases` ran in the same WORK.
#
# Random weights: compare modes and schemes with each other and with the hardware's compute floor, not accuracy.
set -euo pipefail

WORK=${WORK:-gpu-work}
RESULTS=${RESULTS:-bench/results}
CLEF_QUANT=${CLEF_QUANT:-clef-quant}
read -r -a engine_args <<<"${ENGINE_ARGS:-}"

if [[ -z ${TAG:-} ]]; then
  if [[ ${DRY_RUN:-0} == 1 ]] || ! command -v nvidia-smi >/dev/null; then
    TAG=gpu
  else
    # "NVIDIA H200" -> h200: the reports are named after the card they measured.
    TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')
  fi
fi

bf16=$WORK/flash
fp8=$WORK/flash-FP8_DYNAMIC
nvfp4a16=$WORK/flash-NVFP4A16
nvfp4=$WORK/flash-NVFP4
serve_report=$RESULTS/serve-$TAG.md
clef=$WORK/clef
clef_fp8=$WORK/clef-FP8_DYNAMIC
omni=$WORK/omni
omni_fp8_block=$WORK/omni-FP8_BLOCK

run() {
  if [[ ${DRY_RUN:-0} == 1 ]]; then
    echo "$*"
  else
    echo "+ $*" >&2
    "$@"
  fi
}

# run, with the command's output kept in the file $1; a failure is reported and the steps go on (a release that
# `inspect` finds fault with is a finding, and the latency run after it still measures it).
report() {
  local file=$1
  shift
  if [[ ${DRY_RUN:-0} == 1 ]]; then
    echo "$*"
  else
    echo "+ $* > $file" >&2
    "$@" >"$file" || echo "exit $? from: $* (output in $file)" >&2
  fi
}

step_releases() {
  run "$CLEF_QUANT" make-tiny "$bf16" --size flash --device cuda
  run "$CLEF_QUANT" quantize "$bf16" --scheme fp8-dynamic --device cuda --out "$fp8"
  run "$CLEF_QUANT" quantize "$bf16" --scheme nvfp4a16 --device cuda --out "$nvfp4a16"
  run "$CLEF_QUANT" quantize "$bf16" --scheme nvfp4 --device cuda --out "$nvfp4"
}

step_fp8() {
  run "$CLEF_QUANT" bench modes --release "$fp8@invariant,batched,invariant-vllm" --serve FP8_DYNAMIC \
    --repeats 2 --latency-requests 20 "${engine_args[@]}" --out "$serve_report"
}

step_profile() {
  # The profiler slows what it watches: its own report, never appended to the clean one.
  run "$CLEF_QUANT" bench modes --release "$fp8@invariant,batched" \
    --profile FP8_DYNAMIC:invariant --profile FP8_DYNAMIC:batched \
    --repeats 2 --latency-requests 10 "${engine_args[@]}" --out "$RESULTS/serve-$TAG-fp8-profile.md"
}

step_schemes() {
  run "$CLEF_QUANT" bench modes --append --release "$bf16@invariant,batched" \
    --release "$nvfp4a16@invariant,batched" --release "$nvfp4@invariant,batched" \
    --repeats 2 --latency-requests 20 "${engine_args[@]}" --out "$serve_report"
}

step_native() {
  run "$CLEF_QUANT" bench modes --append --release "$fp8@invariant" --serve FP8_DYNAMIC \
    --serve-native FP8_DYNAMIC --repeats 1 "${engine_args[@]}" --out "$serve_report"
}

step_eval() {
  run "$CLEF_QUANT" build-data --out "$WORK/data" --source fixtures --per-task 8 --calibration-count 0 \
    --tokenizer "$bf16"
  run "$CLEF_QUANT" eval --reference "$bf16" --candidate "$fp8" --candidate "$nvfp4a16" --data "$WORK/data" \
    --device cuda --max-model-len 4096 "${engine_args[@]}" --out "$WORK/eval"
}

step_latency() {
  run "$CLEF_QUANT" bench latency --release "$bf16" --release "$fp8" "${engine_args[@]}" \
    --out "$RESULTS/latency-$TAG.md"
}

step_clef() {
  run "$CLEF_QUANT" make-tiny "$clef" --size clef --device cuda
  run "$CLEF_QUANT" quantize "$clef" --scheme fp8-dynamic --device cuda --out "$clef_fp8"
  run "$CLEF_QUANT" bench latency --release "$clef_fp8" --mode invariant --mode invariant-gdn-eager --repeats 5 \
    --profile "${engine_args[@]}" --out "$RESULTS/latency-$TAG-27b-gdn-graphs.md"
  run "$CLEF_QUANT" bench latency --release "$clef" --repeats 5 --profile "${engine_args[@]}" \
    --out "$RESULTS/latency-$TAG-27b-bf16.md"
}

step_omni() {
  run "$CLEF_QUANT" make-tiny "$omni" --size omni --device cuda
  report "$RESULTS/quantize-$TAG-omni-fp8-block.txt" \
    "$CLEF_QUANT" quantize "$omni" --scheme fp8-block --device cuda --out "$omni_fp8_block"
  report "$RESULTS/inspect-$TAG-omni-fp8-block.json" "$CLEF_QUANT" inspect "$omni_fp8_block" --engines --json
  run "$CLEF_QUANT" bench latency --release "$omni_fp8_block" --repeats 5 "${engine_args[@]}" \
    --out "$RESULTS/latency-$TAG-omni.md"
}

steps=("$@")
if [[ ${#steps[@]} == 0 ]]; then
  steps=(releases fp8 profile schemes native eval latency)
fi
for step in "${steps[@]}"; do
  if ! declare -F "step_$step" >/dev/null; then
    echo "unknown step '$step'; the steps: releases fp8 profile schemes native eval latency clef omni" >&2
    exit 2
  fi
done
[[ ${DRY_RUN:-0} == 1 ]] || mkdir -p "$RESULTS"
for step in "${steps[@]}"; do
  "step_$step"
done
