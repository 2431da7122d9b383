#!/usr/bin/env bash
# The overlap kernels' GPU check (issue 21), for a session lent one H200 by the device tool; at
# most 5 minutes. Stage the wheels once, here, as for scripts/gpu_check.sh:
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl
#   pip download (cp312, manylinux) omegaconf==2.3.0 into .whl, a wheel of antlr4-python3-runtime==4.9.3,
#   and `python -m build --wheel --outdir .whl .` (rlweave; megatron-core is not needed here);
# then run it there with carry [".whl"]:  bash scripts/gpu_check_overlap.sh
# It checks the plugin's unit tests on the GPU machine's Python, then runs
# scripts/gpu_check_overlap.py: results to $OUT and bench-results/ (overlap-gpu.json, .png, and
# the measured profile overlap-profile-h200.json). Dry run on CPU: python scripts/gpu_check_overlap.py --cpu-dry-run
set -uo pipefail
REPO=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())" || exit 1
(cd /tmp && timeout 60 python3 -m pytest "$REPO/tests/test_overlap.py" -q -p no:cacheprovider 2>&1 | tail -3)
timeout 240 python3 "$REPO/scripts/gpu_check_overlap.py" --out "${OUT:-bench-results}" 2>&1 | grep -v Warning | tee "${OUT:-.}/gpu_check_overlap.log" | tail -40
