#!/bin/bash
# A/B timing on the GPU machine, in one call: the working tree ("head") and package copies under
# ab/<name>/frontier (e.g. `git archive <rev> frontier | tar -x -C ab/<name>`, carried with the
# call), alternated so drift between runs shows up. Kernel times with the in-kernel per-phase
# breakdown on the first run (scripts/batch_variants.py), 8B preset, depth 7 unless PRESET is set;
# MODES (e.g. "persistent,graph") picks the launch modes timed.
#     bash scripts/ab_bench.sh "head base" "1 16" [reps]
source scripts/gpu_env.sh
variants=${1:-"head base"}
batches=${2:-"1 16"}
reps=${3:-2}
preset=${PRESET:-eagle3-llama3.1-8b}
for b in $batches; do
    for r in $(seq "$reps"); do
        for v in $variants; do
            if [ "$v" = head ]; then p=$(pwd); else p=$(pwd)/ab/$v; fi
            echo "== $v batch $b run $r"
            PYTHONPATH=/tmp/site:$p python3 scripts/batch_variants.py --preset "$preset" --batches "$b" \
                --tunings base --modes "${MODES:-persistent}" --breakdown "$( [ "$r" = 1 ] && echo "$b" || echo 0 )" 2>&1 | grep -v Warning \
                | sed "s/ base\( \|:\)/ $v\1/"
        done
    done
done
