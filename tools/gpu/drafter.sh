#!/usr/bin/env bash
# One GPU call for the static-buffer Drafter: its tests (capture and replay included), the
# generation loop's tests on triton, then the
# bench rows beside the uncaptured call, 8B and 1B presets at depth 7, batch 1 and 16, one run.
# Usage (device tool, carrying .whl): bash tools/gpu/drafter.sh [test seconds] [bench seconds]
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
nvidia-smi -L
timeout "${1:-240}" python3 -m pytest -q -m "" -p no:cacheprovider tests/test_drafter.py tests/test_bench.py 2>&1 | tail -6
# the generation loop drafting through a captured Drafter (the default on CUDA)
timeout 150 python3 -m pytest -q -m "" -p no:cacheprovider tests/test_generation.py tests/test_generation_batch.py \
  -k "triton or static" 2>&1 | tail -6
timeout "${2:-330}" python3 -c "import sys; from frontier.cli import main; sys.exit(main(sys.argv[1:]))" bench --depth 7 --batch 1,16 --backend triton --reps 50 \
  --json-out "${OUT:-/tmp}/drafter_bench.json" 2>&1 | tail -12
