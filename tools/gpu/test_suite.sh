#!/usr/bin/env bash
# The whole test suite on the GPU machine in one call: every test, GPU-marked or not (on a GPU the
# Triton kernels compile for the device instead of running under the interpreter), split
# round-robin into SHARDS pytest processes that share one Triton cache. Each shard's verbose log
# lands in $OUT/shards.tgz; the summary counts them. Tests a shard had not reached when its time
# ran out are listed in $OUT/unfinished.txt, to pass as the node list of a second call:
#   bash tools/gpu/test_suite.sh [SHARDS] [SECONDS] [node-id file]
# Run with the device tool, carrying .whl (pydantic wheels; see tools/gpu/env.sh).
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
SHARDS=${1:-14}
LIMIT=${2:-520}
OUT=${OUT:-/tmp/gpu_parity}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=/tmp/triton_cache_parity
nvidia-smi -L | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
if [ -n "$3" ]; then
  cp "$3" "$OUT/nodes.txt"
else
  python3 -m pytest --collect-only -q -p no:cacheprovider -m "" tests/ 2>/dev/null | grep '::' > "$OUT/nodes.txt"
fi
echo "$(wc -l < "$OUT/nodes.txt") tests in $SHARDS shards, ${LIMIT}s each" | tee "$OUT/summary.txt"
for s in $(seq 0 $((SHARDS - 1))); do
  awk -v n="$SHARDS" -v s="$s" '(NR - 1) % n == s' "$OUT/nodes.txt" > "$OUT/shard$s.txt"
  mapfile -t nodes < "$OUT/shard$s.txt"  # (node ids may hold spaces)
  timeout -s INT -k 30 "$LIMIT" python3 -m pytest -v -p no:cacheprovider -m "" -rfE --durations=15 \
    "${nodes[@]}" > "$OUT/shard$s.log" 2>&1 &
done
wait
python3 tools/gpu/parity_summary.py "$OUT" "$SHARDS" | tee -a "$OUT/summary.txt"
# (few files come back from the device: the shards' lists and logs travel as one archive)
tar -C "$OUT" -czf "$OUT/shards.tgz" $(cd "$OUT" && ls shard*.txt shard*.log) && rm -f "$OUT"/shard*.txt "$OUT"/shard*.log
