"""``rlweave plan``: predict an RL job's step on a given cluster from a trace of the user's own
job (issue 44). Neutral: no framework imports.

- :mod:`rlweave.plan.record`: a tracing-plugin trace read into a :class:`JobRecord`;
- :mod:`rlweave.plan.cluster`: the cluster file, what the trace cannot know;
- :mod:`rlweave.plan.gpus`: default GPU profiles with their sources;
- :mod:`rlweave.plan.scale`: the job projected onto the cluster, as verl's default sync step.

Every figure it predicts is SIMULATED or MODELLED, and says which.
"""

from rlweave.plan.cluster import Cluster, ClusterError, load_cluster, parse_cluster
from rlweave.plan.gpus import DEFAULTS, GpuProfile
from rlweave.plan.record import NOT_IN_TRACE, JobRecord, RecordError, record
from rlweave.plan.scale import ASSUMPTIONS, StepPrediction, predict_step

__all__ = ["ASSUMPTIONS", "DEFAULTS", "NOT_IN_TRACE", "Cluster", "ClusterError", "GpuProfile", "JobRecord",
           "RecordError", "StepPrediction", "load_cluster", "parse_cluster", "predict_step", "record"]
