#!/usr/bin/env bash
# The three GRPO credit variants (plain GRPO, progress estimates, same-page step groups) trained with the same seeds,
# tasks, steps and budget, the SFT start model evaluated, then every paired comparison. The variants run one after
# another; PARALLEL=1 runs them side by side (at micro-batch 4 each stays under 30 GiB, so two share an H200; at 8,
# three on one H200 ran out of its memory after 4-6 steps).
# CREDITS="spa steps" picks variants; GPUS="0 1 1" puts the variants, in order, on those GPUs (CUDA_VISIBLE_DEVICES). Logs go to $LOGS (default: <run>/logs); $PYTHON (default python3) runs them.
#   scripts/reference_grpo_variants.sh SFT_MERGED RUN OUT [reference_grpo.py options, e.g. --time-budget-min 16]
set -uo pipefail
sft=$1 run=$2 out=$3; shift 3
logs=${LOGS:-$run/logs}; mkdir -p "$logs"
py() { "${PYTHON:-python3}" -u scripts/reference_grpo.py "$sft" --run "$run" --out "$out" "$@"; }
# the SFT evaluation first: it also builds the shop that every variant then reads
py --stages eval_sft "$@" > "$logs/sft.log" 2>&1 || { cat "$logs/sft.log"; exit 1; }
credits=${CREDITS:-episode spa steps}; gpus=(${GPUS:-}); pids=(); status=0; i=0
for c in $credits; do
  [ ${#gpus[@]} -gt 0 ] && export CUDA_VISIBLE_DEVICES=${gpus[$((i % ${#gpus[@]}))]}; i=$((i+1))
  if [ "${PARALLEL:-0}" = 1 ]; then py --credit $c --stages grpo,eval_grpo "$@" > "$logs/$c.log" 2>&1 & pids+=($!)
  else py --credit $c --stages grpo,eval_grpo "$@" > "$logs/$c.log" 2>&1 || status=1; fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
for c in $credits; do py --credit $c --stages compare "$@" >> "$logs/compare.log" 2>&1 || status=1; done
grep -h -E "steps,|eval |won|stopped|Error|error" "$logs"/*.log
exit $status
