#!/usr/bin/env bash
# `make demo`: the whole release flow on the tiny checkpoint, offline, on CPU, in a few minutes.
#   make-tiny -> build-data (fixtures) -> quantize FP8_DYNAMIC and NVFP4 -> inspect both -> eval through the plugin
#   -> bench throughput -> card (with plots) for both -> upload --dry-run for both.
# Everything lands in artifacts/demo/ (DEMO_OUT to change it), which is rebuilt from scratch on every run.
set -euo pipefail

VENV=${VENV:-.venv}
OUT=${DEMO_OUT:-artifacts/demo}
CLI="$VENV/bin/clef-quant"

# Offline: nothing below may reach a network; the data comes from eval/fixtures, the model from make-tiny.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# vLLM on CPU: a 1 GiB KV cache is plenty for the tiny model (the default reserves most of the RAM), and the
# engine runs in-process, which starts in seconds instead of ~20 s per engine.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}

PER_TASK=4          # evaluation records per task (7 tasks)
CALIBRATION=16      # calibration records for NVFP4, drawn from the tasks' training splits
MAX_LEN=4096        # the fixtures' requests are well under this
THROUGHPUT_RECORDS=4
REPO_ORG=clef-demo  # the dry run names this org; nothing is sent
NOTICE="Demo build made by \`make demo\` from a random-weight tiny checkpoint (\`clef-quant make-tiny\`) and \
synthetic fixture rows: no number on this card says anything about clef-flash, which \`base_model\` names only \
because the tiny checkpoint stands in for it."

started=$SECONDS
step_started=$SECONDS
step() {
  printf '\n==> [%3ds] %s\n' "$((SECONDS - started))" "$*"
  step_started=$SECONDS
}
done_step() { printf '    (%ds)\n' "$((SECONDS - step_started))"; }

if [ ! -x "$CLI" ]; then
  echo "error: $CLI not found; run make setup first" >&2
  exit 2
fi

rm -rf "$OUT"
mkdir -p "$OUT"

step "make-tiny: a random-weight Clef release (the bf16 source)"
"$CLI" make-tiny "$OUT/tiny"
done_step

step "build-data: $PER_TASK evaluation records per task and $CALIBRATION calibration records, from eval/fixtures"
"$CLI" build-data --out "$OUT/data" --source eval/fixtures --per-task "$PER_TASK" --calibration-count "$CALIBRATION" \
  --tokenizer "$OUT/tiny"
done_step

step "quantize: FP8_DYNAMIC (no calibration)"
"$CLI" quantize "$OUT/tiny" --scheme fp8-dynamic --out "$OUT/tiny-FP8_DYNAMIC"
done_step

step "quantize: NVFP4, calibrated on the calibration records"
"$CLI" quantize "$OUT/tiny" --scheme nvfp4 --calibration "$OUT/data/calibration.jsonl" \
  --calibration-records "$CALIBRATION" --out "$OUT/tiny-NVFP4"
done_step

for scheme in FP8_DYNAMIC NVFP4; do
  step "inspect: tiny-$scheme"
  "$CLI" inspect "$OUT/tiny-$scheme" > "$OUT/inspect-$scheme.txt"
  tail -n 1 "$OUT/inspect-$scheme.txt"
  done_step
done

step "eval: bf16 reference (transformers) vs the noise floor and both candidates (vLLM plugin)"
"$CLI" eval --reference "$OUT/tiny" --candidate "$OUT/tiny-FP8_DYNAMIC" --candidate "$OUT/tiny-NVFP4" \
  --data "$OUT/data" --out "$OUT/results" --max-model-len "$MAX_LEN" --enforce-eager
done_step

step "bench throughput: $THROUGHPUT_RECORDS records through every side"
"$CLI" bench throughput --reference "$OUT/tiny" --quantized "$OUT/tiny-FP8_DYNAMIC" --quantized "$OUT/tiny-NVFP4" \
  --data "$OUT/data" --records "$THROUGHPUT_RECORDS" --max-model-len "$MAX_LEN" --enforce-eager \
  --out "$OUT/throughput-cpu.md"
done_step

for scheme in FP8_DYNAMIC NVFP4; do
  step "card: tiny-$scheme (README.md, plots, vllm_plugin/ and scripts/ copied in, manifest updated)"
  "$CLI" card "$OUT/tiny-$scheme" --results "$OUT/results" --throughput "$OUT/throughput-cpu.md" \
    --repo-id "$REPO_ORG/clef-tiny-$scheme" --base-model Cloudflare/clef-flash --license apache-2.0 \
    --notice "$NOTICE"
  done_step
done

for scheme in FP8_DYNAMIC NVFP4; do
  step "upload --dry-run: tiny-$scheme"
  "$CLI" upload "$OUT/tiny-$scheme" --repo-id "$REPO_ORG/clef-tiny-$scheme" --dry-run > "$OUT/upload-$scheme.txt"
  head -n 3 "$OUT/upload-$scheme.txt"
  done_step
done

cat <<EOF

make demo finished in $((SECONDS - started)) s. Everything is under $OUT/:
  bf16 source (make-tiny)      $OUT/tiny/
  evaluation data              $OUT/data/ (eval/*.jsonl, calibration.jsonl, summary.json)
  quantized releases           $OUT/tiny-FP8_DYNAMIC/  $OUT/tiny-NVFP4/
  inspect reports              $OUT/inspect-FP8_DYNAMIC.txt  $OUT/inspect-NVFP4.txt
  eval results                 $OUT/results/results.md (also results.json, results.csv, probs/)
  throughput                   $OUT/throughput-cpu.md
  model cards                  $OUT/tiny-FP8_DYNAMIC/README.md  $OUT/tiny-NVFP4/README.md
  plots                        $OUT/tiny-*/assets/*.png
  upload dry runs              $OUT/upload-FP8_DYNAMIC.txt  $OUT/upload-NVFP4.txt
Next: serve one with  VLLM_CPU_KVCACHE_SPACE=1 $VENV/bin/clef-systemone --model $OUT/tiny-NVFP4
EOF
