"""``virtualpar.parallel``: DP × TP × PP × CP with ZeRO, sequence parallelism and recomputation, composed.

``ParallelConfig`` names the degrees and builds the mesh ``{"dp", "pp", "cp", "tp"}``;
``ParallelTrainer(model, config, optimizer)`` is the training operation: ``cluster.execute(trainer,
tokens, targets)`` runs one step and returns the loss, ``trainer.state_dict(cluster)`` the weights.
Cutting any ``nn.Module`` at named calls of its traced forward (NeuronX-style) is the pipeline
package's: ``virtualpar.pipeline.Pipeline(model, cuts=["blocks.2"])`` (re-exported here as
``TracedPipeline``, with ``trace_calls``), trained by ``PipelinedOperation`` like any pipeline.
Device-side code uses only the Device protocol.
"""

from __future__ import annotations

from .config import AXES, ParallelConfig
from ..pipeline.trace import trace_calls
from ..pipeline.traced import TracedPipeline
from .trainer import ParallelTrainer

__all__ = ["ParallelConfig", "ParallelTrainer", "AXES", "TracedPipeline", "trace_calls"]
