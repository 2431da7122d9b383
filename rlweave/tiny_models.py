"""Tiny random-weight models and an offline tokenizer, built deterministically on this machine.

The real model-loading code paths of vLLM, verl and Megatron run on these with no hub access.
Models: ``tiny-llama`` (dense), ``tiny-mixtral`` (8 experts, top-2) and ``tiny-qwen2moe``
(4 experts, top-2, shared expert). Their vocabulary equals the tokenizer's length, so a rollout
engine and a trainer agree on every logit. ``head_dim`` is 64 because vLLM's CPU attention
kernels support only certain head sizes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MODEL_NAMES = ("tiny-llama", "tiny-mixtral", "tiny-qwen2moe")
FORMAT_VERSION = 1  # bump to rebuild every cached model


def models_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlweave" / "models"
    return Path(os.environ.get("RLWEAVE_MODELS_DIR", default))


def _corpus() -> list[str]:
    """A fixed text with digits, arithmetic and chat markup: what the tests and demos prompt."""
    words = ("the model adds numbers and answers with a short sentence about the result "
             "what is plus minus times equals question answer think step by step tool call "
             "user assistant system hello world expert token route rollout reward").split()
    lines = []
    for i in range(400):
        a, b = (i * 37) % 97, (i * 53) % 89
        lines.append(f"what is {a} plus {b}? the answer is {a + b}.")
        lines.append(" ".join(words[(i + k) % len(words)] for k in range(12)))
    return lines


def build_tokenizer(out: Path, vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{% else %}<|assistant|>"
        "{% endif %}{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    fast.save_pretrained(out)
    return fast


def _config(name: str, vocab: int, tok):
    from transformers import LlamaConfig, MixtralConfig, Qwen2MoeConfig

    common = dict(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                  max_position_embeddings=2048, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  tie_word_embeddings=False, torch_dtype="bfloat16")
    if name == "tiny-llama":
        return LlamaConfig(**common)
    if name == "tiny-mixtral":
        return MixtralConfig(**common, num_local_experts=8, num_experts_per_tok=2)
    return Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                          shared_expert_intermediate_size=256, decoder_sparse_step=1)


def ensure_tiny_model(name: str) -> Path:
    """Path of model ``name``, built on first use (a few seconds) and cached."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown tiny model '{name}'; choose from {', '.join(MODEL_NAMES)}")
    out = models_dir() / name
    stamp = out / "rlweave.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("format") == FORMAT_VERSION:
        return out
    import torch
    from transformers import AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(name, len(tok), tok), torch_dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    stamp.write_text(json.dumps({"format": FORMAT_VERSION, "vocab": len(tok)}))
    return out
