#!/usr/bin/env bash
# One GPU call for fp8 heads: the fp8 GPU tests and the compile of every launch the bench makes (in parallel processes: the Triton cache on disk is shared), then the
# bench itself in one process, bf16 and fp8 side by side: the 8B and 1B presets (FP8_PRESETS) at
# depth 7, batches 1, 2, 4, 8 and 16 (FP8_BATCHES), triton (then torch_ref at batch 1), and the
# gate/up and down streams alone in each format (tools/gpu/fp8_stream.py); fp8 vs plain trees of
# random heads. Writes $OUT/fp8_bench*.json, $OUT/fp8_stream.json, $OUT/fp8_quality_gpu.json and
# $OUT/fp8_tests.txt. FP8_STREAMS=0 leaves out the streams alone; FP8_TEST_K selects GPU tests (pytest -k).
# Usage (device tool, carrying .whl): bash tools/gpu/fp8.sh [bench seconds]
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BATCHES=${FP8_BATCHES:-1,2,4,8,16}
PRESETS=${FP8_PRESETS:-eagle3-llama3.1-8b,eagle3-llama3.2-1b}
OUT=${OUT:-/tmp/frontier-fp8-out}
mkdir -p "$OUT"
nvidia-smi -L
t0=$(date +%s)
stamp() { echo "[fp8 +$(( $(date +%s) - t0 ))s] $*"; }
bench() { python3 -c "import sys; from frontier.cli import main; sys.exit(main(sys.argv[1:]))" bench "$@"; }

stamp "compile every bench launch (a process per preset, format and batch) beside the fp8 GPU tests"
for p in ${PRESETS//,/ }; do
  for w in plain fp8; do
    for b in ${BATCHES//,/ }; do
      timeout 330 bash -c "$(declare -f bench); bench --preset $p --depth 7 --weights $w --batch $b --backend triton --reps 2" \
        > "$OUT/warm_${p}_${w}_${b}.log" 2>&1 &
    done
  done
done
if [ "${FP8_TESTS:-1}" = 1 ]; then  # FP8_TESTS=0: the bench alone
  if [ "${FP8_QUALITY:-1}" = 1 ]; then  # FP8_QUALITY=0: the tests without the quality run
    # fp8 vs plain trees on random heads (benchmarks/fp8_quality.py; torch_ref: no compile)
    timeout 200 python3 benchmarks/fp8_quality.py --device cuda --backend torch_ref --seeds 8 \
      --json-out "$OUT/fp8_quality_gpu.json" > "$OUT/fp8_quality.txt" 2>&1 &
  fi
  timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 ${FP8_TEST_K:+-k "$FP8_TEST_K"} \
    tests/test_triton_fp8.py > "$OUT/fp8_tests.txt" 2>&1
  stamp "fp8 GPU tests: $(tail -1 "$OUT/fp8_tests.txt")"
fi
wait
stamp "compiled"
for f in "$OUT"/warm_*.log; do grep -q -i "error\|traceback" "$f" && { echo "== $f"; tail -20 "$f"; }; done
rm -f "$OUT"/warm_*.log

stamp "bench"
timeout "${1:-240}" bash -c "$(declare -f bench); bench --preset ${PRESETS//,/ --preset } --depth 7 \
  --weights plain,fp8 --batch $BATCHES --backend triton --reps 50 --json-out $OUT/fp8_bench.json" 2>&1 | tail -30
stamp "torch_ref beside it (batch 1, uncaptured)"
timeout 60 bash -c "$(declare -f bench); bench --preset ${PRESETS//,/ --preset } --depth 7 \
  --weights plain,fp8 --batch 1 --backend torch_ref --no-captured --reps 50 --json-out $OUT/fp8_bench_torch_ref.json" 2>&1 | tail -8
if [ "${FP8_STREAMS:-1}" = 1 ]; then
  stamp "the gate/up and down streams alone (tools/gpu/fp8_stream.py)"
  timeout 150 python3 tools/gpu/fp8_stream.py --json-out "$OUT/fp8_stream.json" 2>&1 | grep -v Warning
fi
stamp "done"
if [ "${FP8_TESTS:-1}" = 1 ]; then
  [ -f "$OUT/fp8_quality.txt" ] && tail -15 "$OUT/fp8_quality.txt"
  grep -E "^(FAILED|E  )|passed|failed" "$OUT/fp8_tests.txt" | tail -25
fi
