"""rlweave's plugins: one package per published system, pure algorithms over
:mod:`rlweave.types`. Nothing here imports verl, vLLM, SGLang, Megatron or Ray."""
