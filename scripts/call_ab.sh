#!/bin/bash
# A/B of the whole triton call's time (host work included) on the GPU machine: the working tree
# ("head") and package copies under ab/<name>/frontier, alternated run by run so that the host's
# drift shows up (scripts/host_overhead.py --time-only; 8B preset unless PRESET is set).
#     bash scripts/call_ab.sh "head base" [runs]
source scripts/gpu_env.sh
variants=${1:-"head base"}
runs=${2:-3}
preset=${PRESET:-eagle3-llama3.1-8b}
for r in $(seq "$runs"); do
    for v in $variants; do
        if [ "$v" = head ]; then p=$(pwd); else p=$(pwd)/ab/$v; fi
        echo -n "$v run $r: "
        PYTHONPATH=/tmp/site:$p python3 scripts/host_overhead.py --preset "$preset" --time-only 2>&1 | grep -v Warning
    done
done
