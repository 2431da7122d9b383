"""Stream generation (StreamRL, arXiv 2504.15930): streamed rollout, skewness-aware dispatch,
and a resource planner for disaggregated generation and training.

Pure parts, no framework imported:

- :mod:`.stream`: :class:`~.stream.SampleStream`, the bounded stream of finished samples between
  generation producers and the trainer (complete GRPO groups only, weight-version staleness
  bound, exactly-once delivery across producer deaths), and :func:`~.stream.groups_to_take`,
  the size of a dynamic batch that keeps room for the groups at their last chance;
- :mod:`.ranker`: :class:`~.ranker.LengthRanker`, online output-length ranking, and the
  skewness-aware dispatch order (predicted long tail first);
- :mod:`.planner`: instances per stage per hardware pool, with the predicted throughput;
- :mod:`.plugin`: ``rlweave_dispatch_order``, ``rlweave_sample_finished`` and
  ``rlweave_dynamic_batch``.

The verl adapter is :mod:`rlweave.adapters.verl.stream_trainer` (trainer mode
``rlweave_stream``). Its data plane is verl's own TransferQueue, not a Ray queue: verl's
agent-loop workers already write every trajectory there and tag its group's status, TQ is saved
with each checkpoint, and verl re-issues unfinished prompt groups on resume; a Ray queue would
carry the tensors a second time and lose that recovery. So the adapter replaces only the control
plane (a ``ReplayBuffer`` subclass that polls the tags, hands out complete groups exactly once
and fires the ranker hooks), and :class:`~.stream.SampleStream` is the same contract for a
generation service outside verl (producers that claim and put samples), tested on its own.

*Semantics.* On-policy: every trained sample was generated with the weights the step started
from; the optimizer steps wait for the step's last group when the trainer recomputes the old
log-probs, and stream with the mini-batches when they are the rollout's. GRPO advantages need
only complete groups (guaranteed); estimators that normalise over the batch (GAE, REINFORCE++,
ReMax) are refused in stream mode rather than given a new meaning. Async: engines keep
generating while the trainer trains, staleness ``k`` maps to verl's ``max_off_policy_threshold =
k + 1`` with the ``drop`` strategy, and a dynamic batch keeps room for the groups at their last
chance so that few are dropped.

*Not done:* long-tail instances (the predicted tail on engines with a small ``max_num_seqs``),
elastic re-planning as lengths drift, and a planner that models shared devices (see the
README's ``bench stream`` figures).
"""
