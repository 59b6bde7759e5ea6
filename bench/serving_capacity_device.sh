#!/bin/bash
# The serving-capacity series of bench/serving_load.md section 9, as run on the lent H100 (`run` tool): the branch
# and its missing cp312 wheels carried in .whl/ (git-ignored), GPU telemetry sampled every second beside it.
# Usage (on the device): bash PATH/bench/serving_capacity_device.sh [RUNS] [STEPS], with PATH/.whl holding the wheels
# (the branch's own, `pip wheel --no-deps -w .whl .`, among them) and PATH/bench this folder's serving_*.py.
set -u
cd "$(dirname "$0")/.." || exit 1
RUNS=${1:-5}
STEPS=${2:-7}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt"
python3 -c "import torch, torchvision, pydantic, scipy, mlperf_loadgen, trtflow_stages; print(torch.__version__, \
torchvision.__version__, pydantic.__version__, scipy.__version__, trtflow_stages.__file__)" >"$OUT/versions.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,pstate,clocks_event_reasons.active,\
utilization.gpu --format=csv -l 1 >"$OUT/telemetry.csv" 2>&1 &
SMI=$!
cd bench && timeout 540 python3 serving_load.py --device cuda --model resnet50 --sections capacity --runs "$RUNS" \
    --duration 2 --confirm-s 10 --confirm-steps "$STEPS" --confirm-visits 2 --confirm-step 2.5 --reference-s 10 \
    --reference-levels 4 --probes 6 --start-rate 700 --budget-ms 20 --cuda-graphs --capacity-parts short reference \
    --out "$OUT" 2>&1 | tee "$OUT/capacity.log"
kill $SMI
