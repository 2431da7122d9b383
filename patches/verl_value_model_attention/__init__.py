"""verl on CPU: build the critic's value model with the configured attention, not FlashAttention.

``verl.utils.model.load_valuehead_model`` loads ``AutoModelForTokenClassification`` with a
hard-coded ``attn_implementation="flash_attention_2"``, ignoring the critic's
``override_config.attn_implementation``; without flash-attn it falls back to TRL's value head
and fails when TRL is absent. This loads the same class with the attention implementation the
model config carries (``sdpa`` on CPU).
"""

from __future__ import annotations

from rlweave.patches import Revert


def apply() -> Revert:
    import verl.utils.model as model_utils

    original = model_utils.load_valuehead_model

    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):  # type: ignore[no-untyped-def]
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
            attn_implementation=getattr(model_config, "_attn_implementation", None) or "sdpa",
            trust_remote_code=trust_remote_code,
        )

    model_utils.load_valuehead_model = load_valuehead_model

    def revert() -> None:
        model_utils.load_valuehead_model = original

    return revert
