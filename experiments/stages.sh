# Sourced by the studies' scripts (chapter_scale.sh, stability_fixes.sh): a stage is one Hydra multirun into
# $SWEEPS/NAME, its log beside it, resumable across sessions (carry $SWEEPS along). A stage that ended with every
# cell finished (or diverged) leaves $SWEEPS/NAME.done holding its KEY and is skipped while the key is the same;
# one that stopped part way runs again with train.resume=true (finished runs are left as they are, the others
# continue from their last checkpoint). Each stage's wall time is appended to $SWEEPS/stages.tsv (stage,
# seconds, exit status, UTC end), one line a session. The caller sets SWEEPS and STAGES before sourcing this;
# EXTRA="k=v ..." is added to every stage, PYTHON picks the interpreter.

py=${PYTHON:-python3}
# shellcheck disable=SC2206
EXTRA_ARGS=(${EXTRA:-})

check_stages() {  # check_stages NAME...: every name a stage of $STAGES, refused before any stage runs
  local name
  for name in "$@"; do
    case " $STAGES " in *" $name "*) ;; *) echo "unknown stage: $name ($STAGES)" >&2; exit 2 ;; esac
  done
  mkdir -p "$SWEEPS"
}

run_stage() {  # run_stage NAME KEY OVERRIDE...: KEY is what makes the stage the same stage (its command)
  local name=$1 key=$2 resume=() t0 rc
  shift 2
  if [ -f "$SWEEPS/$name.done" ] && [ "$(cat "$SWEEPS/$name.done")" = "$key" ]; then
    echo "stage $name: done (rm $SWEEPS/$name.done to run it again)"
    return 0
  fi
  [ -d "$SWEEPS/$name" ] && resume=(train.resume=true)
  t0=$(date +%s)
  $py -m andrea_exp -m "hydra.sweep.dir=$SWEEPS/$name" logger.mode=disabled train.progress=false "${resume[@]}" \
    "$@" >> "$SWEEPS/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" "$rc" "$(date -u +%FT%TZ)" >> "$SWEEPS/stages.tsv"
  echo "stage $name: $(( $(date +%s) - t0 )) s, exit $rc"
  grep -E "cells, [0-9]+ failed|^error|Error" "$SWEEPS/$name.log" | tail -n 3
  [ "$rc" -eq 0 ] && echo "$key" > "$SWEEPS/$name.done"
  case $rc in 130|143) exit "$rc" ;; esac  # the session was stopped: no further stage starts
  return 0
}
