"""Megatron's sequence-parallel TP linears with FLUX's overlap (``rlweave.overlap``).

:mod:`.linears` holds ``ColumnParallelLinear`` / ``RowParallelLinear`` subclasses (same
constructor, same parameters and state dict) that ask ``rlweave_tp_linear_impl`` how to run each
input shape and run it with one of the backends: :mod:`.ring` (decomposed ring over
torch.distributed point-to-point, gloo and NCCL), :mod:`.symm_mem` (torch's fused
symmetric-memory ops, CUDA), :mod:`.tile` (rlweave's Triton kernels of :mod:`.tile_kernels`,
FLUX's signal protocol, CUDA). :mod:`.probe` says which backends a device can run;
:mod:`.spec` puts the linears into a layer spec.
"""
