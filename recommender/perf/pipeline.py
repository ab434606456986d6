"""Pipeline parallelism across instances (vLLM ``--pipeline-parallel-size``): what one stage holds, what a hop costs.

A replica of ``pp`` stages runs stage k on its own instance (a TP group), layers ``k L / pp .. (k + 1) L / pp``.

* memory: each stage is :func:`pipeline_stage` of the model on ``tp`` GPUs (conservatively with both the embedding
  and the head); the replica holds the KV of the tokens one stage holds;
* time: a step passes through the stages in turn, so it costs the whole model on ``tp`` GPUs (each stage reads its
  weights and KV once) plus, per stage boundary, the step's activations (``hidden x 2 B`` per new token) over the
  NIC between the instances (:func:`hop_s_per_token`) and a fixed :data:`PP_HOP_LATENCY_S`. One batch is in flight
  (vLLM can keep up to ``pp`` in flight: conservative by up to ``pp`` x in throughput, not in latency).
"""

from __future__ import annotations

import dataclasses
import math

from recommender.hf_config import ModelArch

#: Fixed cost of one pipeline-stage hop per step (an RDMA send and the next stage's wait): an assumption of the
#: order of a NIC round trip plus a kernel launch, not a measured figure.
PP_HOP_LATENCY_S = 50e-6

#: Bytes of one token's activations passed between stages per hidden unit (bf16 / fp16).
ACTIVATION_BYTES = 2.0


def pipeline_stage(model: ModelArch, pp: int) -> ModelArch:
    """The fullest of ``pp`` pipeline stages as a model of its own: ``ceil(L / pp)`` layers and, of a MoE model, as
    many of them MoE layers as the model has (``min(ceil(L / pp), n_moe)``: a stage of the MoE layers that follow the
    first dense ones, as vLLM splits layers contiguously). Its parameter counts (``count_params``) follow, so a stage
    holds its share of the experts; with the layers cut alone a MoE stage kept every expert layer (and a negative
    count of dense ones)."""
    layers = math.ceil(model.num_layers / pp)
    moe = model.moe
    if moe is None:
        return dataclasses.replace(model, num_layers=layers)
    return dataclasses.replace(model, num_layers=layers,
                               moe=dataclasses.replace(moe, num_moe_layers=min(layers, moe.num_moe_layers)))


def why_not_pipelined(model: ModelArch, pp: int) -> str:
    """"" when ``model`` splits into ``pp`` stages the model prices, else why not (sliding-window layers, whose
    stage layout the memory model does not follow, or fewer layers than stages)."""
    if pp > 1 and (model.num_sliding_layers or model.num_layers < pp):
        return f"pipeline parallel is not modelled for {model.id} (sliding-window layers or too few layers)"
    return ""


def hop_s_per_token(model: ModelArch, pp: int, nic_bytes_per_s_per_gpu: float) -> float:
    """Seconds per new token of a step to pass its activations across the ``pp - 1`` stage boundaries:
    ``(pp - 1) x hidden x 2 B / NIC`` (bytes/s per GPU); 0 for one stage."""
    if pp <= 1:
        return 0.0
    return (pp - 1) * model.hidden_size * ACTIVATION_BYTES / nic_bytes_per_s_per_gpu
