#!/usr/bin/env bash
# The claims at the chapter's scale on one GPU: ANDREA-120M (experiment=claims_120m) and, for comparison,
# the small model's grid (experiment=claims_grid, andrea_small, T 128) on the same prepared tokens.
#   experiments/chapter_scale.sh prepare      # $CORPUS (python -m andrea_exp.corpora) -> BPE 8192 tokens in $TOKENS
#   experiments/chapter_scale.sh calibrate    # step time per d_k and mask (40 steps), then the LR scan
#   experiments/chapter_scale.sh runs         # the preset's 24 runs (d_k 64, 256), one after another
#   experiments/chapter_scale.sh runs4096     # d_k 4096 (bilinear), causal, scale on/off, 3 seeds
#   experiments/chapter_scale.sh small        # claims_grid on the same tokens, 3 seeds, cells side by side
#   experiments/chapter_scale.sh reference    # per model, the scaled causal d_k 64 cell trained longer with
#                                             # report_role=reference: progress 1 on tokens without a known floor
#   experiments/chapter_scale.sh report       # the calibration table and "At the chapter's scale" into $RESULTS
# With no stage: every stage in that order. Resumable stage by stage, across sessions (carry $SWEEPS along):
# a stage that ended with every cell finished (or diverged) leaves $SWEEPS/NAME.done holding its command and
# is skipped while the command is the same; one that stopped part way (a signal, a time limit) is resumed
# (train.resume=true: finished runs are left as they are, the others continue from their last checkpoint).
# Each stage's wall time is appended to $SWEEPS/stages.tsv (stage, seconds, exit status, UTC end), one line a
# session, so the time of a stage run over several sessions is their sum.
# EXTRA="k=v ..." is added to every training stage (a smoke test: EXTRA="train.max_steps=20" with its own
# SWEEPS, since a changed command reruns a done stage and a resume refuses changed settings).
set -u
SWEEPS=${SWEEPS:-multirun/chapter_scale}
RESULTS=${RESULTS:-experiments/results/chapter_scale}
CORPUS=${CORPUS:-debian-docs}
TOKENS=${TOKENS:-corpora/debian-docs-bpe}
STAGES="prepare calibrate runs runs4096 small reference report"
# shellcheck source=experiments/stages.sh
. "$(dirname "$0")/stages.sh"
check_stages "$@"

sweep() {  # sweep NAME [overrides...]: a stage on the prepared tokens (stages.sh)
  local name=$1
  shift
  run_stage "$name" "$* ${EXTRA_ARGS[*]} data.path=$TOKENS" "data.path=$TOKENS" "$@" "${EXTRA_ARGS[@]}"
}

prepare() {
  [ -f "$TOKENS/meta.json" ] && { echo "tokens ready in $TOKENS"; return 0; }
  local corpus; corpus=$(dirname "$TOKENS")
  $py -m andrea_exp.corpora "$CORPUS" "$corpus" || return 1
  if [ -d "$corpus/$CORPUS" ]; then  # a folder of documents: hold out whole documents, a seeded choice
    $py -m andrea_exp.prepare "$corpus/$CORPUS" --out "$TOKENS" --tokenizer bpe --vocab-size 8192 --split documents \
      --val-fraction 0.05
  else
    $py -m andrea_exp.prepare "$corpus/$CORPUS.txt" --out "$TOKENS" --tokenizer bpe --vocab-size 8192
  fi
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
    runs4096) sweep runs4096 experiment=claims_120m model.d_k=4096 model.causal=true ;;
    small) sweep small experiment=claims_grid data=tokens seed=0,1,2 hydra/launcher=local_gpus \
             "cells_per_gpu=${CELLS_PER_GPU:-12}" ;;
    reference)  # judged nowhere: the report reads them only as progress 1 on their model's data (T tells them apart)
      sweep reference experiment=claims_120m report_role=reference model.d_k=64 model.scale=true model.causal=true \
        seed=100,101 train.max_steps=1300 train.eval_every=100 name=claims_120m_reference
      sweep reference_small experiment=claims_grid data=tokens report_role=reference model.d_k=64 model.scale=true \
        model.causal=true seed=100,101 train.max_steps=3000 name=claims_grid_reference ;;
    report) $py -m andrea_exp.report.scale "$SWEEPS" --out "$RESULTS" ${MACHINE:+--machine "$MACHINE"} ;;
  esac
done
