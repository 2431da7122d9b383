#!/usr/bin/env bash
# The prepared GPU check, for a session lent a GPU by the device tool. Prepare once, here:
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl
#   pip download (cp312, manylinux) megatron-core==0.19.2 omegaconf==2.3.0 into .whl, a wheel of
#   antlr4-python3-runtime==4.9.3, and `python -m build --wheel --outdir .whl .` (rlweave);
# then run it there with carry [".whl"]:  bash scripts/gpu_check.sh
# It runs rlweave's unit tests on the GPU machine's Python/torch, then scripts/gpu_check.py and
# scripts/gpu_check_replay_balance.py.
set -uo pipefail
REPO=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
(cd /tmp && python3 -m pytest "$REPO/tests" -q -p no:cacheprovider -k "not fresh_venv" 2>&1 | tail -5) | tee "${OUT:-.}/unit_tests.txt"
(cd /tmp && timeout 300 python3 "$REPO/scripts/gpu_check.py") 2>&1 | grep -v Warning | tail -40
(cd /tmp && timeout 300 python3 "$REPO/scripts/gpu_check_replay_balance.py") 2>&1 | grep -v Warning | tail -20
