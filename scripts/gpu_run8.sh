#!/usr/bin/env bash
# Eighth GPU call: in-kernel tree packing; final bench table; GPU parity subset; host overhead.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
timeout 200 python3 -m frontier.cli bench --json $OUT/bench_final.json 2>&1 | tee $OUT/bench_final.log
timeout 120 python3 -m pytest -q tests/test_triton.py -m gpu -k "persistent-eagle or medium or packing" 2>&1 | tail -4 | tee $OUT/pytest8.log
timeout 60 python3 scripts/host_overhead.py 2>&1 | tee $OUT/host.log
