"""``virtualpar.parallel``: DP × TP × PP × CP with ZeRO, sequence parallelism and recomputation, composed.

``ParallelConfig`` names the degrees and builds the mesh ``{"dp", "pp", "cp", "tp"}``;
``ParallelTrainer(model, config, optimizer)`` is the training operation: ``cluster.execute(trainer,
tokens, targets)`` runs one step and returns the loss, ``trainer.state_dict(cluster)`` the weights.
``TracedPipeline`` cuts any ``nn.Module`` at named calls of its traced forward (NeuronX-style), and
``TracedPipelineOperation`` trains it on the one pipeline executor.  Device-side code uses only the
Device protocol.
"""

from __future__ import annotations

from .config import AXES, ParallelConfig
from .trace import trace_calls
from .traced import TracedPipeline, TracedPipelineOperation
from .trainer import ParallelTrainer

__all__ = ["ParallelConfig", "ParallelTrainer", "AXES", "TracedPipeline", "TracedPipelineOperation",
           "trace_calls"]
