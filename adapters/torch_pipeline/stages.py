"""Tiny Llama models cut into pipeline stages: the actor (causal LM) and the critic (value head).

Both are built from a local config with random weights (no hub download), ``layers_per_stage``
decoder layers per stage. Stage 0 also holds the embedding; the last stage holds the final norm
and the head, and computes the micro-batch's loss (already divided by the number of
micro-batches, so the accumulated gradient is that of the mean loss):

- actor: next-token cross-entropy of ``input_ids``;
- critic: mean squared error of the per-token values against ``returns``.

:func:`reference_loss` runs the whole model in one piece (Hugging Face's own ``LlamaModel``
forward), the reference the fused pipeline's gradients are checked against.
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN, VOCAB = 128, 512


def tiny_llama_config(layers: int):  # -> LlamaConfig
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
                       num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=64, max_position_embeddings=256, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, attn_implementation="sdpa", dtype="float32")


class TinyModel(nn.Module):
    """A Llama backbone with an LM head (actor) or a scalar value head (critic)."""

    def __init__(self, layers: int, value_head: bool, seed: int) -> None:
        super().__init__()
        from transformers import LlamaModel

        torch.manual_seed(seed)
        self.backbone = LlamaModel(tiny_llama_config(layers))
        self.head = nn.Linear(HIDDEN, 1 if value_head else VOCAB, bias=False)
        self.value_head = value_head


class Stage(nn.Module):
    """Layers ``[first, last)`` of a :class:`TinyModel`, plus the embedding on stage 0 and the
    norm, head and loss on the final stage."""

    def __init__(self, model: TinyModel, stage: int, stages: int) -> None:
        super().__init__()
        per = len(model.backbone.layers) // stages
        self.layers = nn.ModuleList(model.backbone.layers[stage * per:(stage + 1) * per])
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.config = model.backbone.config
        self.rotary = model.backbone.rotary_emb
        self.embed = model.backbone.embed_tokens if self.is_first else None
        self.norm = model.backbone.norm if self.is_last else None
        self.head = model.head if self.is_last else None
        self.value_head = model.value_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: token ids [batch, seq] on stage 0, else hidden states [batch, seq, hidden].
        Returns hidden states, or on the last stage the head's output."""
        from transformers.masking_utils import create_causal_mask

        h = self.embed(x) if self.embed is not None else x
        positions = torch.arange(h.shape[1]).unsqueeze(0)
        mask = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=None,
                                  past_key_values=None, position_ids=positions)
        rotary = self.rotary(h, position_ids=positions)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
        return self.head(self.norm(h)) if self.is_last else h


def micro_batch_loss(output: torch.Tensor, batch: dict[str, torch.Tensor], value_head: bool,
                     micro_batches: int) -> torch.Tensor:
    if value_head:
        return ((output.squeeze(-1) - batch["returns"]) ** 2).mean() / micro_batches
    logits, ids = output[:, :-1], batch["input_ids"][:, 1:]
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1)) / micro_batches


def reference_loss(model: TinyModel, batch: dict[str, torch.Tensor], micro_batches: int) -> torch.Tensor:
    """The same loss through Hugging Face's whole-model forward (no pipeline)."""
    hidden = model.backbone(input_ids=batch["input_ids"]).last_hidden_state
    return micro_batch_loss(model.head(hidden), batch, model.value_head, micro_batches)


def make_batches(count: int, batch: int, seq: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """``count`` micro-batches of random tokens and returns."""
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, VOCAB, (batch, seq), generator=gen),
             "returns": torch.randn(batch, seq, generator=gen)} for _ in range(count)]
