#!/usr/bin/env bash
# One GPU call for the whole project: every GPU-marked test, then speculative generation per backend.
# Run with the device tool, carrying .whl (pydantic wheels; see tools/gpu/env.sh). Logs under $OUT.
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 90 python3 -m pytest -q -m gpu tests/test_stub.py tests/test_torch_ref_gpu.py 2>&1 | tail -5 | tee "$OUT/pytest_gpu_core.log"
timeout 240 python3 -m pytest -q -m gpu tests/test_triton.py 2>&1 | tail -8 | tee "$OUT/pytest_gpu_triton.log"
timeout 230 python3 benchmarks/generate.py --out "$OUT" --quick 2>&1 | tee "$OUT/generate.log" | tail -40
