#!/usr/bin/env bash
# A/B timing of builds of the package on one GPU machine, in one call: the working tree ("head")
# and package copies under ab/<name>/frontier, alternated run by run so that drift between runs
# shows up. The same command runs against each build; only the imported package differs.
#
#     mkdir -p ab/base && git archive <rev> frontier | tar -x -C ab/base   # once, before the call
#     bash benchmarks/ab.sh "head base" 3 benchmarks/host_overhead.py --time-only
#     bash benchmarks/ab.sh "head base" 2 -m frontier.cli bench --preset eagle3-llama3.1-8b --depth 7
#
# Arguments: the builds ("head" = this working tree, NAME = ab/NAME), runs per build, then the
# python3 arguments (a script path relative to the repository root, or -m MODULE, and its flags).
# Each run starts in the build's own directory with PYTHONSAFEPATH set, so neither the current
# directory nor the script's directory shadows the build; each line says which package it ran.
# Carry ab/ with the device call (it is git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/gpu/env.sh
root=$(pwd)
builds=${1:?usage: bash benchmarks/ab.sh \"head base\" RUNS SCRIPT|-m MODULE [args...]}
runs=${2:?runs per build}
shift 2
args=("$@")
if [ "${#args[@]}" -gt 0 ] && [ -f "${args[0]}" ]; then
    args[0]="$root/${args[0]}"
fi
for b in $builds; do
    if [ "$b" = head ]; then p=$root; else p=$root/ab/$b; fi
    [ -d "$p/frontier" ] || { echo "ab.sh: no package at $p/frontier" >&2; exit 2; }
done
for r in $(seq "$runs"); do
    for b in $builds; do
        if [ "$b" = head ]; then p=$root; else p=$root/ab/$b; fi
        echo "== $b run $r ($(cd "$p" && PYTHONSAFEPATH=1 PYTHONPATH=/tmp/site:$p python3 -c 'import frontier; print(frontier.__file__)'))"
        (cd "$p" && PYTHONSAFEPATH=1 PYTHONPATH=/tmp/site:$p python3 "${args[@]}" 2>&1 | grep -v Warning || true)
    done
done
