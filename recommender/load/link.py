"""The KV-transfer link of a disaggregated (P/D) deployment: a server with a capacity, not a delay.

Each prefill replica pushes every finished prompt's KV cache to a decode replica over its NICs
(NIXL / RDMA; ``tp`` GPUs, one NIC each). One transfer of a ``P``-token prompt occupies the link for

    S(P) = latency_s + P x bytes_per_token / bytes_per_s,   bytes_per_s = min(tp_p, tp_d) x nic_bytes_per_s

(the slower end bounds it). Transfers queue FIFO per prefill replica (the simulator does exactly this).
Besides the transfer, every request pays ``handoff_s`` on its way from prefill to decode that holds no link
(the router's second hop, the decode engine's bootstrap and admission of the landed KV): a delay, not a
service time, so it adds to TTFT and never to the link's utilisation. :data:`KV_HANDOFF_S` is its measured value.
Analytically the link is an M/G/1 queue per prefill replica at ``lam_p = lam / R_p``:
``rho_link = lam_p E[S]`` (and the decode side's ingress ``lam / R_d x E[P] x bytes_per_token /
(tp_d x nic_bytes_per_s)``, whichever is higher), Pollaczek-Khinchine wait
``E[W] = rho / (1 - rho) x E[S^2] / (2 E[S])``, zero with probability ``1 - rho``, else exponential
with mean ``E[W] / rho``. A link at ``rho_link >= 1`` is over-subscribed: the plan is unstable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from recommender.errors import ConfigError

#: Seconds a P/D request spends between its prefill and its decode engine beyond the KV transfer: the median, over
#: InferenceX's disaggregated DeepSeek-R1 rows of at most 8 requests in flight (nothing queues), of measured minus
#: predicted median TTFT, with a 2 ms handshake priced as link time: 60 ms over the three stacks, MoRI SGLang 70,
#: Dynamo SGLang 40, Dynamo TensorRT-LLM -3 (``benchmarks/bench_inferencex_disagg.py``,
#: ``benchmarks/results/inferencex-disagg.md``). vLLM's NIXL path (a proxy's second request, the decode engine
#: polling for the landed blocks) is not measured there.
KV_HANDOFF_S = 0.06


@dataclass(frozen=True)
class KvLink:
    """KV transfer between the pools: bytes of KV per prompt token (whole model), NIC bandwidth per
    GPU (one direction), the TP sizes of both ends, a fixed cost per transfer that holds the link (the
    handshake) and a fixed delay per request that does not (``handoff_s``: module docstring)."""

    bytes_per_token: float
    nic_bytes_per_s: float
    prefill_tp: int = 1
    decode_tp: int = 1
    latency_s: float = 0.0
    handoff_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.bytes_per_token >= 0.0 and self.nic_bytes_per_s > 0.0 and self.latency_s >= 0.0
                and 0.0 <= self.handoff_s < math.inf):
            raise ConfigError("KV link needs bytes_per_token >= 0, nic_bytes_per_s > 0, latency_s >= 0, "
                              f"0 <= handoff_s < inf; got {self}")
        if self.prefill_tp < 1 or self.decode_tp < 1:
            raise ConfigError(f"KV link TP sizes must be >= 1, got {self.prefill_tp} / {self.decode_tp}")

    @property
    def bytes_per_s(self) -> float:
        """One transfer's bandwidth: the slower end's NICs together."""
        return min(self.prefill_tp, self.decode_tp) * self.nic_bytes_per_s

    def transfer_s(self, prompt_tokens: np.ndarray | float) -> np.ndarray | float:
        """``S(P)``: seconds one transfer holds the link."""
        return self.latency_s + np.asarray(prompt_tokens, dtype=float) * (self.bytes_per_token / self.bytes_per_s)


@dataclass(frozen=True)
class LinkSolution:
    """The link at an arrival rate: utilisation (busier end), P(wait), mean wait and transfer per point."""

    utilisation: float
    wait_p: float
    wait_mean_s: float
    transfer_s: np.ndarray

    @property
    def stable(self) -> bool:
        return self.utilisation < 1.0

    def wait(self, e_wait: np.ndarray) -> np.ndarray:
        """Per point, from unit exponentials: 0 w.p. ``1 - p``, else exponential with mean ``E[W] / p``."""
        if self.wait_p <= 0.0 or self.wait_mean_s <= 0.0:
            return np.zeros_like(e_wait)
        return np.maximum(e_wait + math.log(self.wait_p), 0.0) * (self.wait_mean_s / self.wait_p)


def solve_link(
    link: KvLink, *, arrival_rate_per_s: float, prefill_replicas: int, decode_replicas: int, prompt_tokens: np.ndarray
) -> LinkSolution:
    """M/G/1 per prefill replica (formulas in the module docstring); ``prompt_tokens`` per point."""
    s = np.asarray(link.transfer_s(prompt_tokens), dtype=float)
    e_s = float(s.mean())
    e_s2 = float((s * s).mean())
    lam_p = arrival_rate_per_s / prefill_replicas
    rho_p = lam_p * e_s
    rho_d = arrival_rate_per_s / decode_replicas * float(np.mean(prompt_tokens)) * link.bytes_per_token / (
        link.decode_tp * link.nic_bytes_per_s)
    rho = max(rho_p, rho_d)
    if rho_p >= 1.0 or e_s <= 0.0:
        return LinkSolution(rho, 1.0 if rho_p >= 1.0 else 0.0, math.inf if rho_p >= 1.0 else 0.0, s)
    w = rho_p / (1.0 - rho_p) * e_s2 / (2.0 * e_s)
    return LinkSolution(rho, rho_p, w, s)
