"""FLUX (arXiv 2406.06858): tensor-parallel communication hidden inside the GEMM.

Pure decisions over neutral types, no framework import: the ring schedule each rank follows
(:mod:`.schedule`), the timeline model that predicts an overlapped collective+GEMM's time, its
effective communication time ``ECT`` and ``E_overlap`` (:mod:`.model`), the device profiles the
model reads (:mod:`.profiles`), and the choice of backend and chunking per linear
(:mod:`.choose`, behind the ``rlweave_tp_linear_impl`` hook in :mod:`.plugin`).
"""
