"""Run a fused actor–critic pipeline schedule on real stages with torch.distributed point-to-point.

RLHFuse's intra-stage fusion places the actor's pipeline and the critic's (reversed, ``k``
replicas) on the same ranks and interleaves their tasks in one searched order per rank
(``rlweave fusion schedule``). This adapter executes such an order.

Why not Megatron-core's schedule API: ``get_forward_backward_func()`` returns
``forward_backward_pipelining_without_interleaving`` (Megatron's fixed 1F1B) or the interleaved
variant (an order computed from ``get_schedule_table``); neither takes an order from the
caller, one call trains one model, and their ``P2PCommunicator`` talks only to the next and
previous rank of the one pipeline group ``parallel_state`` knows, so a second model running in
the reverse direction on the same ranks cannot be expressed. The executor therefore sends the
activations and their gradients itself (``torch.distributed.isend``/``recv``, tagged per model,
phase and micro-batch) and runs each stage's forward and ``torch.autograd.backward`` in the
order given. Stage modules are plain ``torch.nn.Module`` s; :mod:`.stages` cuts them from
Hugging Face Llama models (actor: causal LM; critic: value head).

- :mod:`.placement`: which rank holds which stage (the plugin's convention, restated here so
  the adapter needs no plugin import) and the check that refuses an order before it runs;
- :mod:`.executor`: :class:`~.executor.FusedPipelineExecutor`, one rank's step;
- :mod:`.stages`: the tiny Llama actor and value-head critic split into stages.
"""
