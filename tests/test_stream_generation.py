"""StreamRL's stream generation: the size of each dynamic batch, the settings the stream
trainer asks for, and the stream_generation config section."""

from __future__ import annotations

import pytest

from rlweave.config import ConfigError, Setting, build_config
from rlweave.host import PLUGIN_MODULES_ENV, build_plugin_manager
from rlweave.plugins.stream_generation.dynamic_batch import groups_to_take
from rlweave.types import DynamicBatchRequest, StreamSettings


# -- config -------------------------------------------------------------------------------------


def test_config_validates_options() -> None:
    c = build_config([Setting("stream_generation.mode", "async", "test"),
                      Setting("stream_generation.max_staleness", 2, "test")]).stream_generation
    assert (c.mode, c.max_staleness, c.skewness_dispatch) == ("async", 2, True)
    with pytest.raises(ConfigError, match="unknown rlweave.stream_generation.mode 'offline'; allowed: on_policy, async"):
        build_config([Setting("stream_generation.mode", "offline", "test")])
    with pytest.raises(ConfigError, match="max_staleness'; allowed: >= 1"):
        build_config([Setting("stream_generation.max_staleness", 0, "test")])
    with pytest.raises(ConfigError, match="ranker_decay'; allowed: in \\(0, 1\\]"):
        build_config([Setting("stream_generation.ranker_decay", 1.5, "test")])
    with pytest.raises(ConfigError, match="long_tail_fraction'; allowed: in \\(0, 1\\]"):
        build_config([Setting("stream_generation.long_tail_fraction", 0, "test")])
    with pytest.raises(ConfigError, match="poll_s'; allowed: in \\(0, 10\\] seconds"):
        build_config([Setting("stream_generation.poll_s", 0, "test")])
    assert build_config([Setting("stream_generation.enable", True, "test")]).stream_generation.enable


@pytest.mark.parametrize(("ready_due", "ready_other", "pending_due", "most", "expected"), [
    (0, 6, 0, 8, 6),  # nothing due: every ready group, in whole mini-batches
    (0, 7, 0, 8, 6),
    (2, 6, 0, 8, 8),  # due groups first, then the rest up to the step's remaining groups
    (0, 6, 3, 8, 4),  # 3 due still generating: 4 slots (two mini-batches) kept for them
    (1, 6, 1, 2, 0),  # the step's last mini-batch is the two due groups: wait for the second
    (1, 6, 1, 8, 6),  # ... or take 6 newer ones now, leaving that mini-batch
    (0, 8, 8, 8, 0),  # the whole rest of the step is due: newer groups must wait
    (3, 0, 9, 2, 2),  # more due than the step holds: the ready due ones, up to the step
])
def test_a_dynamic_batch_keeps_room_for_the_groups_due_this_step(ready_due, ready_other, pending_due, most,
                                                                 expected):
    assert groups_to_take(DynamicBatchRequest(ready_due, ready_other, pending_due, minibatch=2, most=most)) == expected


def test_bad_dynamic_batch_counts_fail_clearly() -> None:
    with pytest.raises(ValueError, match="counts must be >= 0 and minibatch >= 1"):
        groups_to_take(DynamicBatchRequest(0, 1, 0, minibatch=0, most=2))


def test_the_plugin_answers_the_stream_trainer_through_its_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream trainer reads no plugin config: it asks how to stream and how many groups
    to take through the hooks."""
    monkeypatch.setenv("RLWEAVE_LOAD_PLUGINS", "")
    hook = build_plugin_manager(build_config([])).hook
    assert hook.rlweave_stream_settings() is None  # nothing that streams is enabled
    monkeypatch.setenv(PLUGIN_MODULES_ENV, "rlweave.plugins.stream_generation.plugin")
    hook = build_plugin_manager(build_config([Setting("stream_generation.mode", "async", "test"),
                                              Setting("stream_generation.max_staleness", 2, "test"),
                                              Setting("stream_generation.poll_s", 0.2, "test")])).hook
    assert hook.rlweave_stream_settings() == StreamSettings("async", 2, 0.2)
    assert hook.rlweave_dynamic_batch(request=DynamicBatchRequest(0, 6, 3, minibatch=2, most=8)) == 4
