#!/usr/bin/env bash
# One GPU call for fp8 heads: a compile smoke test, the fp8 GPU tests and the compile of every
# launch the bench makes (in parallel processes: the Triton cache on disk is shared), then the
# bench itself in one process, bf16 and fp8 side by side: 8B and 1B presets at depth 7, batch 1
# and 16, triton (then torch_ref at batch 1). Writes $OUT/fp8_bench*.json and $OUT/fp8_tests.txt.
# Usage (device tool, carrying .whl): bash tools/gpu/fp8.sh [bench seconds]
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
OUT=${OUT:-/tmp/frontier-fp8-out}
mkdir -p "$OUT"
nvidia-smi -L
t0=$(date +%s)
stamp() { echo "[fp8 +$(( $(date +%s) - t0 ))s] $*"; }
bench() { python3 -c "import sys; from frontier.cli import main; sys.exit(main(sys.argv[1:]))" bench "$@"; }

stamp "smoke: a bf16 fp8 head through triton and torch_ref"
timeout 120 python3 - <<'PY' || exit 1
import torch, frontier
from frontier.random_head import random_config, random_weights, random_inputs
cfg = random_config(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1408,
                    vocab_size=4000, target_vocab_size=16000, total_token=60, depth=6, top_k=10)
for pow2 in (True, False):
    q = random_weights(cfg, seed=0, device="cuda", dtype=torch.bfloat16, lm_head_scale=6.0).quantized(power_of_two=pow2)
    ids, f = random_inputs(cfg, context=68, seed=1, device="cuda", dtype=torch.bfloat16)
    a = frontier.frontier_generate(cfg, f, input_ids=ids, weights=q, backend="triton")
    b = frontier.frontier_generate(cfg, f, input_ids=ids, weights=q, backend="torch_ref")
    print("pow2" if pow2 else "any", "same tree:", a.same_tree(b), flush=True)
PY

stamp "compile every bench launch (8 processes) beside the fp8 GPU tests"
for p in eagle3-llama3.1-8b eagle3-llama3.2-1b; do
  for w in plain fp8; do
    for b in 1 16; do
      timeout 420 bash -c "$(declare -f bench); bench --preset $p --depth 7 --weights $w --batch $b --backend triton --reps 2" \
        > "$OUT/warm_${p}_${w}_${b}.log" 2>&1 &
    done
  done
done
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_triton_fp8.py > "$OUT/fp8_tests.txt" 2>&1
stamp "fp8 GPU tests: $(tail -1 "$OUT/fp8_tests.txt")"
wait
stamp "compiled"
for f in "$OUT"/warm_*.log; do grep -q -i "error\|traceback" "$f" && { echo "== $f"; tail -20 "$f"; }; done
rm -f "$OUT"/warm_*.log

stamp "bench"
timeout "${1:-240}" bash -c "$(declare -f bench); bench --preset eagle3-llama3.1-8b --preset eagle3-llama3.2-1b --depth 7 \
  --weights plain,fp8 --batch 1,16 --backend triton --reps 50 --json-out $OUT/fp8_bench.json" 2>&1 | tail -14
stamp "torch_ref beside it (batch 1, uncaptured)"
timeout 120 bash -c "$(declare -f bench); bench --preset eagle3-llama3.1-8b --preset eagle3-llama3.2-1b --depth 7 \
  --weights plain,fp8 --batch 1 --backend torch_ref --no-captured --reps 50 --json-out $OUT/fp8_bench_torch_ref.json" 2>&1 | tail -8
stamp "done"
tail -25 "$OUT/fp8_tests.txt"
