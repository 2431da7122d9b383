"""A plugin from another distribution gets options, validation, a doctor row and its hooks
registered when enabled, through an entry point alone: nothing in ``rlweave/`` names it.

The package and its distribution metadata are written here, on ``sys.path``, as pip would
install them; ``importlib.metadata`` finds the entry point the same way.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from rlweave import registry
from rlweave.config import ConfigError, build_config, settings_from_env, settings_from_overrides, to_env
from rlweave.doctor import plugins_table
from rlweave.host import activate

OPTIONS = '''
from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import ConfigError, PluginInfo, PluginSection


@dataclass
class QuotaOptions(PluginSection):
    available: ClassVar[bool] = True
    paper: ClassVar[str] = "Acme's quota"
    limit: int = 4

    def finalize(self) -> None:
        if self.limit < 1:
            raise ConfigError(f"bad value {self.limit!r} for 'rlweave.{SECTION}.limit'; allowed: >= 1.")


PLUGIN = PluginInfo(SECTION, QuotaOptions, hooks=f"{PACKAGE}.hooks")
'''

HOOKS = '''
from rlweave.hookspecs import hookimpl

seen = []


@hookimpl
def rlweave_configure(config):
    seen.append(getattr(config, SECTION).limit)
'''


def _install(root: Path, package: str, section: str, entry_point: str) -> None:
    """Write ``package`` and a dist-info whose ``rlweave.plugins`` entry point is ``entry_point``."""
    code = root / package
    code.mkdir()
    header = f"SECTION = {section!r}\nPACKAGE = {package!r}\n"
    (code / "__init__.py").write_text("")
    (code / "options.py").write_text(header + textwrap.dedent(OPTIONS))
    (code / "hooks.py").write_text(header + textwrap.dedent(HOOKS))
    dist = root / f"{package}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[rlweave.plugins]\n{entry_point}\n")


def _forget() -> None:
    registry.sources.cache_clear()
    registry.plugin.cache_clear()


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Where to install packages; the registry forgets them afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _forget()
    yield tmp_path
    _forget()
    for name in [m for m in sys.modules if m.startswith("acme_")]:
        del sys.modules[name]


def test_a_third_party_plugin_gets_options_validation_a_doctor_row_and_its_hooks(installed):
    _install(installed, "acme_quota", "acme_quota", "acme_quota = acme_quota.options:PLUGIN")

    config = build_config(settings_from_overrides(["+rlweave.acme_quota.enable=true",
                                                   "+rlweave.acme_quota.limit=8"]))
    assert config.acme_quota.limit == 8
    assert to_env(config)["RLWEAVE__ACME_QUOTA__LIMIT"] == "8"
    assert build_config(settings_from_env(to_env(config))) == config

    host = activate(settings_from_overrides(["+rlweave.acme_quota.enable=true", "+rlweave.acme_quota.limit=8"]),
                    export_env=False)
    assert "acme_quota.hooks" in dict(host.pm.list_name_plugin())
    assert sys.modules["acme_quota.hooks"].seen == [8]

    rows = {row[0]: row for row in plugins_table()}
    assert rows["acme_quota"][1:] == ["Acme's quota", "yes", "no"]


def test_a_disabled_third_party_plugin_is_absent(installed):
    _install(installed, "acme_quota", "acme_quota", "acme_quota = acme_quota.options:PLUGIN")
    host = activate(export_env=False)
    assert "acme_quota.hooks" not in dict(host.pm.list_name_plugin())
    assert "acme_quota.hooks" not in sys.modules and "acme_quota.options" not in sys.modules


@pytest.mark.parametrize("override, expected", [
    ("+rlweave.acme_quota.limit=many", "bad value 'many' for 'rlweave.acme_quota.limit' (from command line"),
    ("+rlweave.acme_quota.limit=0", "bad value 0 for 'rlweave.acme_quota.limit'; allowed: >= 1."),
    ("+rlweave.acme_quota.limits=2", "unknown option 'rlweave.acme_quota.limits'"),
])
def test_a_third_party_plugins_bad_value_gets_one_clear_error(installed, override, expected):
    _install(installed, "acme_quota", "acme_quota", "acme_quota = acme_quota.options:PLUGIN")
    with pytest.raises(ConfigError) as info:
        build_config(settings_from_overrides([override]))
    assert expected in str(info.value)


def test_a_plugin_claiming_a_suite_section_is_refused_naming_both(installed):
    _install(installed, "acme_tracing", "tracing", "tracing = acme_tracing.options:PLUGIN")
    with pytest.raises(ConfigError, match="two plugins claim the section 'rlweave.tracing': "
                                          "rlweave.plugins.tracing.options:PLUGIN and acme_tracing.options:PLUGIN"):
        build_config(settings_from_overrides(["+rlweave.tracing.enable=true"]))


def test_an_entry_point_naming_another_section_is_refused(installed):
    _install(installed, "acme_quota", "acme_quota", "quota = acme_quota.options:PLUGIN")
    with pytest.raises(ConfigError, match="'quota = acme_quota.options:PLUGIN' .*"
                                          "must name a PluginInfo whose name is 'quota'"):
        build_config(settings_from_overrides(["+rlweave.quota.enable=true"]))
