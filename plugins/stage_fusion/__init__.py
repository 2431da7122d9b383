"""Stage fusion (RLHFuse, NSDI'25: "Optimizing RLHF Training for Large Language Models with
Stage Fusion", arXiv 2409.13221).

**Intra-stage fusion**: PPO's actor and critic train on the same
experiences, independently; with pipeline parallelism each leaves bubbles. RLHFuse places both
pipelines on the same GPUs, the critic's reversed (``k`` replicas when the actor has ``k``
times as many stages), and interleaves their micro-batches in one searched order per GPU, so
that each model fills the other's bubbles (FlexFusion's formulation).

- :mod:`.problem`: :class:`~.problem.FusedPipelineProblem` (sizes, costs, which GPU holds what);
- :mod:`.schedule`: :class:`~.schedule.FusedPipelineSchedule` and the list-scheduling
  simulator (makespan, peak activation memory per GPU and model, validity);
- :mod:`.bounds`: the makespan lower bound reported beside every makespan;
- :mod:`.baselines`: separate 1F1B (today's trainers) and FlexFusion's greedy list schedule;
- :mod:`.justify` and :mod:`.search`: the search (:func:`~.search.search`, the one entry point);
- :mod:`.gantt`: Gantt charts (:func:`~.gantt.plot_fused_schedule`);
- :mod:`.command`: ``rlweave fusion schedule``.

The executor that runs a schedule on real stages is an adapter,
:mod:`rlweave.adapters.torch_pipeline`; the schedule reaches it as data (the CLI's JSON), not
through a hook, so ``rlweave.stage_fusion.enable`` does not switch it on.

**Inter-stage fusion** (generation to inference per sample, with long-tail migration in verl's
stream trainer): :mod:`.migration` (the cost model and the migration plan) and
:mod:`.inter_stage` (the hook implementations ``enable=true`` registers).

Pure Python and numpy: no framework is imported here.
"""
