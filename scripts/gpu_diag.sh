#!/usr/bin/env bash
# Diagnostics on the GPU machine: GPU tests, compiled register/spill counts, and ncu counters per
# phase (one depth of a steps-mode call) at batch 1 and batch 16. Logs under $OUT.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
nvidia-smi -L
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
if [ "${GPU_TESTS:-1}" = 1 ]; then
  timeout ${TEST_T:-330} python3 -m pytest -q -m gpu tests/ 2>&1 | tail -6 | tee $OUT/pytest_gpu.log
fi
for B in ${NCU_BATCHES:-1 16}; do
  timeout ${NCU_T:-140} $NCU --profile-from-start off --clock-control none --csv --page details \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    python3 scripts/ncu_phases.py --batch $B --depth-index 3 --regs --out $OUT/ncu_b${B}_names.json \
    > $OUT/ncu_b${B}.csv 2> $OUT/ncu_b${B}.err
  echo "ncu batch $B rc $?"; grep -E "compiled|profiled" $OUT/ncu_b${B}.csv | head; tail -3 $OUT/ncu_b${B}.err
done
