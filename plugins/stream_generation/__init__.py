"""Stream generation (StreamRL, arXiv 2504.15930): streamed rollout, skewness-aware dispatch,
and a resource planner for disaggregated generation and training.

Pure parts, no framework imported:

- :mod:`.dynamic_batch`: :func:`~.dynamic_batch.groups_to_take`, the size of a dynamic batch
  that keeps room for the groups at their last chance;
- :mod:`.ranker`: :class:`~.ranker.LengthRanker`, online output-length ranking, and the
  skewness-aware dispatch order (predicted long tail first);
- :mod:`.planner`: instances per stage per hardware pool, with the predicted step, from
  measured profiles (``rlweave plan stream``, and ``rlweave bench stream``'s predictions);
- :mod:`.plugin`: ``rlweave_stream_settings``, ``rlweave_dispatch_order``,
  ``rlweave_sample_finished`` and ``rlweave_dynamic_batch``.

The verl adapter is :mod:`rlweave.adapters.verl.stream_trainer` (trainer mode
``rlweave_stream``). Its data plane is verl's own TransferQueue, not a queue of rlweave's:
verl's agent-loop workers already write every trajectory there and tag its group's status, TQ
is saved with each checkpoint, and verl re-issues unfinished prompt groups on resume; a second
queue would carry the tensors twice and lose that recovery. So the adapter replaces only the
control plane (a ``ReplayBuffer`` subclass that polls the tags, hands out complete groups
exactly once and fires the ranker hooks).

*Semantics.* On-policy: every trained sample was generated with the weights the step started
from; the optimizer steps wait for the step's last group when the trainer recomputes the old
log-probs, and stream with the mini-batches when they are the rollout's. GRPO advantages need
only complete groups (guaranteed); estimators that normalise over the batch (GAE, REINFORCE++,
ReMax) keep their meaning: the trainer computes their advantages once the batch is complete,
and the updates wait for them. Async: engines keep
generating while the trainer trains, staleness ``k`` maps to verl's ``max_off_policy_threshold =
k + 1`` with the ``drop`` strategy, and a dynamic batch keeps room for the groups at their last
chance so that few are dropped.

*Not done:* long-tail instances (the predicted tail on engines with a small ``max_num_seqs``),
elastic re-planning as lengths drift, and a planner that models shared devices (see
docs/results/stream.md).
"""
