#!/usr/bin/env bash
# Every fix at every d_k (experiment=stability_fixes), one fix a stage, then the report:
#   experiments/stability_fixes.sh                      # every stage in order
#   experiments/stability_fixes.sh softcap report       # some stages
# Stages: the fixes of conf/fix/ (54 runs each: 6 LRs x d_k 64, 256, 4096 x 3 seeds), then `report`
# (andrea-report over $SWEEPS into $RESULTS). The study is larger than one 10-minute command (about 18 minutes of
# stages on one H200: experiments/README.md), so it runs stage by stage, resumable across sessions (carry $SWEEPS
# along): a stage that ended with every cell finished (or diverged) leaves $SWEEPS/NAME.done holding its command
# and is skipped while the command is the same; one that stopped part way is resumed (train.resume=true:
# finished runs are left as they are, the others continue from their last checkpoint). Each stage's wall time is
# appended to $SWEEPS/stages.tsv (stage, seconds, exit status, UTC end), one line a session.
# EXTRA="k=v ..." is added to every stage (a smoke test: EXTRA="train.max_steps=20" with its own SWEEPS).
set -u
SWEEPS=${SWEEPS:-multirun/stability_fixes}
RESULTS=${RESULTS:-experiments/results/stability_fixes}
PAR=${CELLS_PER_GPU:-16}
py=${PYTHON:-python3}
# shellcheck disable=SC2206
EXTRA_ARGS=(${EXTRA:-})
FIXES="sqrt none inv qk_layernorm inv_qk_layernorm inv_qk_layernorm_z_loss softcap sigma_reparam"
STAGES="$FIXES report"
for name in "$@"; do
  case " $STAGES " in *" $name "*) ;; *) echo "unknown stage: $name ($STAGES)" >&2; exit 2 ;; esac
done
mkdir -p "$SWEEPS"

sweep() {  # sweep FIX: the preset's grid at one fix, one Hydra multirun into $SWEEPS/FIX, its log beside it
  local name=$1 resume=() t0 rc command
  command="experiment=stability_fixes fix=$name ${EXTRA_ARGS[*]}"
  if [ -f "$SWEEPS/$name.done" ] && [ "$(cat "$SWEEPS/$name.done")" = "$command" ]; then
    echo "stage $name: done (rm $SWEEPS/$name.done to run it again)"
    return 0
  fi
  [ -d "$SWEEPS/$name" ] && resume=(train.resume=true)
  t0=$(date +%s)
  $py -m andrea_exp -m experiment=stability_fixes "fix=$name" hydra/launcher=local_gpus "cells_per_gpu=$PAR" \
    "hydra.sweep.dir=$SWEEPS/$name" logger.mode=disabled train.progress=false "${resume[@]}" "${EXTRA_ARGS[@]}" \
    >> "$SWEEPS/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" "$rc" "$(date -u +%FT%TZ)" >> "$SWEEPS/stages.tsv"
  echo "stage $name: $(( $(date +%s) - t0 )) s, exit $rc"
  grep -E "cells, [0-9]+ failed|^error|Error" "$SWEEPS/$name.log" | tail -n 3
  [ "$rc" -eq 0 ] && echo "$command" > "$SWEEPS/$name.done"
  case $rc in 130|143) exit "$rc" ;; esac
  return 0
}

[ $# -eq 0 ] && set -- $STAGES
for name in "$@"; do
  case $name in
    report) $py -m andrea_exp.report "$SWEEPS" --out "$RESULTS" ${MACHINE:+--machine "$MACHINE"} ;;
    *) sweep "$name" ;;
  esac
done
