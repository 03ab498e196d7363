#!/usr/bin/env bash
# The three GRPO credit variants (plain GRPO, progress estimates, same-page step groups) trained side by side on one
# machine with the same seeds, tasks, steps and budget, the SFT start model evaluated beside them, then every paired
# comparison. Logs go to $LOGS (default: <run>/logs); $PYTHON (default python3) runs them.
#   scripts/reference_grpo_variants.sh SFT_MERGED RUN OUT [reference_grpo.py options, e.g. --time-budget-min 16]
set -uo pipefail
sft=$1 run=$2 out=$3; shift 3
logs=${LOGS:-$run/logs}; mkdir -p "$logs"
py() { "${PYTHON:-python3}" -u scripts/reference_grpo.py "$sft" --run "$run" --out "$out" "$@"; }
py --stages '' "$@" > "$logs/shop.log" 2>&1 || { cat "$logs/shop.log"; exit 1; }
pids=()
for c in episode spa steps; do py --credit $c --stages grpo,eval_grpo "$@" > "$logs/$c.log" 2>&1 & pids+=($!); done
py --stages eval_sft "$@" > "$logs/sft.log" 2>&1 & pids+=($!)
status=0; for p in "${pids[@]}"; do wait "$p" || status=1; done
for c in episode spa steps; do py --credit $c --stages compare "$@" >> "$logs/compare.log" 2>&1 || status=1; done
grep -h -E "steps,|eval |won|stopped|Error|error" "$logs"/*.log
exit $status
