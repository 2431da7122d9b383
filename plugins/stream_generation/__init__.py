"""Stream generation (StreamRL, arXiv 2504.15930): streamed rollout, skewness-aware dispatch,
and a resource planner for disaggregated generation and training.

Pure parts, no framework imported:

- :mod:`.stream`: :class:`~.stream.SampleStream`, the bounded stream of finished samples between
  generation producers and the trainer (complete GRPO groups only, weight-version staleness
  bound, exactly-once delivery across producer deaths);
- :mod:`.ranker`: :class:`~.ranker.LengthRanker`, online output-length ranking, and the
  skewness-aware dispatch order (predicted long tail first);
- :mod:`.planner`: instances per stage per hardware pool, with the predicted throughput;
- :mod:`.plugin`: ``rlweave_dispatch_order`` and ``rlweave_sample_finished``.

Design of the verl adapter (next session; ``StreamGenerationConfig`` stays unavailable until
then):

*Mode registration.* verl 0.9's V1 trainer registry: ``register_trainer("rlweave_stream")`` on a
``PPOTrainer`` subclass, selected by ``trainer.v1.trainer_mode`` which the adapter sets from
``rlweave_trainer_mode`` when ``rlweave.stream_generation.enable=true``, so a user flips one
flag. It must be registered before ``adapters/verl/trainer.install()`` so that it is traced too.
The subclass overrides ``step()`` to loop over dynamic mini-batches (one ``_step_once``-style
pipeline per :meth:`~.stream.SampleStream.take`) until the step's groups are consumed, and
``on_step_end`` to publish weights and call :meth:`~.stream.SampleStream.advance_version`.

*Data plane: TransferQueue, not a Ray queue.* In verl 0.9 the agent-loop workers already write
every trajectory into TransferQueue (TQ) and tag its status; TQ is saved with each checkpoint,
and ``_reissue_inflight_prompts`` re-sends unfinished prompt groups on resume. A Ray queue would
carry the tensors a second time through the object store and lose that recovery. rlweave
replaces only the control plane: a ``ReplayBuffer`` subclass plugged in through verl's
``trainer.v1.sampler.custom_sampler.{path,name}`` holds a ``SampleStream`` over TQ keys (the
payload), turns TQ tag transitions into ``put`` calls (metadata polls every few tens of ms
instead of verl's fixed 2 s), and fires ``rlweave_sample_finished``; the trainer's prompt
submission fires ``rlweave_dispatch_order`` and reorders the batch before
``agent_loop_manager.generate_sequences``. Both ranker hooks thus run in the trainer process.
A replica that dies (Ray ``ActorDiedError``) becomes ``producer_lost``; its sample ids are
re-submitted as verl's re-issue does.

*Semantics.* On-policy: every trained sample was generated with the weights the step started
from; verl's mini-batch optimizer steps inside a step do not change the rollout weights, so
mini-batch pipelining stays on-policy. GRPO advantages need only complete groups (guaranteed);
batch-level whitening (REINFORCE++, GAE whitening) would be computed per mini-batch, so the
adapter must refuse those estimators in stream mode rather than change their meaning. Async:
standalone engines keep generating while the trainer trains; the weight push (rlweave's gloo
checkpoint engine on CPU) overlaps the next step, and the stream's drop-and-regenerate bound
replaces verl's ``max_off_policy_strategy``. Staleness k corresponds to verl's
``max_off_policy_threshold = k + 1``, except that verl counts from the step a prompt was
submitted in and the stream from the weights each sample was actually generated with.

*Benchmark* (``rlweave bench stream``): same prompts, model, samples and steps, long-tailed
output lengths (seeded, or ``--lengths`` JSONL forced with ``max_tokens`` and ``ignore_eos``):
verl's sync loop, stream on-policy, stream async k=1, and verl's ``colocate_async`` and
``separate_async``. It reports samples/s ratios with the lower bound, each worker's idle
fraction from the tracing timeline, the staleness histogram (``StreamStats.staleness``), and
:func:`~.planner.predict` on the measured profiles against the measured step. Regime caveat:
on the 2-core CI machine "disaggregated" engines share cores with the trainer.

*Left for the next session:* the adapter above and its integration test (one short verl run),
``rlweave_trainer_mode``, the benchmark, long-tail instances (predicted tail on engines with a
small ``max_num_seqs``), and elastic re-planning as lengths drift.
"""
