#!/usr/bin/env bash
# Time several tunings against the base in one process (GPU machine), after compiling every
# build beforehand in parallel processes (one per tuning; each writes Triton's cache), so the
# timed process only loads them. Usage:
#   bash scripts/tune_sweep.sh BATCH MODES "t1,t2,..." [REPS] [extra batch_variants args...]
# Tunings are batch_variants.py names or inline field=value+field=value; "base" is timed first
# and again last, so drift between the two bounds what a difference can mean.
set -u
b=$1; modes=$2; tunings=$3; reps=${4:-40}; shift 4 2>/dev/null || shift $#
out=${OUT:-/tmp}
echo "$tunings" | tr ',' '\n' | sort -u | xargs -P "${JOBS:-12}" -I{} sh -c \
  "python3 scripts/batch_variants.py --batches $b --tunings '{}' --modes $modes --reps 1 >> $out/warm_b$b.log 2>&1"
grep -h "FAILED" "$out/warm_b$b.log"
python3 scripts/batch_variants.py --batches "$b" --tunings "base,$tunings,base" --modes "$modes" --reps "$reps" "$@"
