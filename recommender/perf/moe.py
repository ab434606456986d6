"""Mixture-of-experts parallelism: expert parallelism (EP), data-parallel attention (DPA), the expert weight
read of a step and the all-to-all that moves tokens to their experts. Pure functions, SI units.

Layout (vLLM's vocabulary): an engine of ``G = tp x dp`` GPUs runs ``dp`` attention ranks (each its own
scheduler, requests and KV cache; attention and the other non-expert weights TP-sharded over that rank's
``tp`` GPUs and replicated across ranks). The routed experts span all ``G`` GPUs:

- ``--enable-expert-parallel`` (EP): each GPU holds ``E_local = E / G`` whole experts;
- without it: every GPU holds ``1 / G`` of every expert (TP-sharded experts).

Per-GPU weights (memory)::

    weights_per_gpu = non_expert_bytes / tp + routed_expert_bytes / G      (K/V replication as in perf.memory)

KV cache: each attention rank holds only its own requests' KV. MLA stores one latent per layer per token on every
GPU of the rank's TP group, so per token and per rank ``layers x (kv_lora_rank + rope) x kv_bytes x tp`` (for
DeepSeek-V3/R1 in bf16: 61 x 576 x 2 = 70,272 B at ``tp = 1`` under DPA, against 8 copies = 562,176 B on TP 8).

Expert weight read of one step whose ``T`` tokens per attention rank are routed top-``k`` over ``E`` experts
(uniform routing; the MoE layer sees the tokens of all ``dp`` ranks, ``T_g = T x dp``)::

    p          = 1 - (1 - k / E)^T_g                    probability that one expert is touched
    touched    = E x p                                  expected distinct experts touched (all ranks)
    EP:        busiest rank's experts = min(E_local, E_local p + z(G) sqrt(E_local p (1 - p)))
               bytes per GPU = busiest x expert_bytes
    no EP:     bytes per GPU = touched x expert_bytes / G
    z(G)       = E[max of G standard normal draws]     (:func:`extreme_z`: 1.03 for G = 4, 1.42 for 8; z(1) = 0)

so a prefill step (``T_g`` in the thousands) reads every expert: 84 GB per GPU for DeepSeek-R1 fp8 on 8 GPUs, a
floor its FLOPs term alone misses. Routed-expert FLOPs follow the busiest rank's token share (EP only)::

    routed_per_rank = T_g k / G;  busiest = routed_per_rank + z(G) sqrt(T_g k (1/G)(1 - 1/G))
    imbalance       = busiest / routed_per_rank          (>= 1; -> 1 as T_g grows)

Collectives per step. Without DPA every rank holds every token: the MoE output is all-reduced like a dense MLP
(``perf.step``'s ring all-reduce, EP or not). With DPA (``dp > 1``) each MoE layer dispatches every token to the
ranks of its experts and combines the results back (all-to-all, one copy per distinct remote rank)::

    remote_ranks = (G - 1) x (1 - (1 - 1 / G)^k)        expected distinct other ranks a token's k experts sit on
    a2a_s        = 2 x (latency + T x remote_ranks x hidden x 2 B / link_bw)          (dispatch + combine)
    dense FFN layers (all-gather + reduce-scatter over G): 2 x (latency + T x (G - 1) x hidden x 2 B / link_bw)
    attention all-reduce inside a rank (tp > 1): ring over tp, one per layer

``link_bw`` is the GPU's one-direction scale-up bandwidth (``Interconnect.ring_bandwidth_bytes_per_s(G)``) times the
profile's ``allreduce_bandwidth_efficiency``; ``latency`` the profile's ``allreduce_latency_s``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from recommender.hf_config import ModelArch
from recommender.perf import memory as mem
from recommender.perf.blocks import check_block_split

ACTIVATION_BYTES = 2.0  # bf16 activations on the wire


def expected_experts_touched(num_experts: int, top_k: int, tokens: float) -> float:
    """``E x (1 - (1 - k/E)^T)``: distinct experts ``T`` tokens routed top-``k`` (uniformly) touch in one layer."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    return float(num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens))


@functools.lru_cache(maxsize=256)
def extreme_z(ranks: int) -> float:
    """How many standard deviations the largest of ``G`` independent normal draws sits above the mean, on average:
    ``E[max] = integral x G phi(x) Phi(x)^(G-1) dx`` (0 for G = 1; 1 / sqrt(pi) = 0.5642 for G = 2, 1.0294 for 4,
    1.4236 for 8, 1.7660 for 16). Midpoint rule over [-10, 10] in steps of 1/200 (within 1e-12 of the closed forms for
    G = 2 and 3).
    ``sqrt(2 ln G)``, the large-G asymptote, overstates it at the G of one node (2.04 for 8: +43%)."""
    if ranks <= 1:
        return 0.0
    h, total = 0.005, 0.0
    for i in range(4000):
        x = -10.0 + (i + 0.5) * h
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        cdf = 0.5 * math.erfc(-x / math.sqrt(2.0))
        total += x * ranks * pdf * cdf ** (ranks - 1)
    return total * h


def busiest_rank_experts(num_experts: int, top_k: int, tokens: float, ranks: int) -> float:
    """Experts the busiest of ``ranks`` EP ranks touches: ``min(E_l, E_l p + z(G) sqrt(E_l p (1-p)))``, ``E_l = E / G``."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    local = num_experts / ranks
    p = float(1.0 - (1.0 - top_k / num_experts) ** tokens)
    return min(local, local * p + extreme_z(ranks) * math.sqrt(local * p * (1.0 - p)))


def routed_imbalance(tokens: float, top_k: int, ranks: int) -> float:
    """Busiest EP rank's routed tokens over the mean share (>= 1): ``1 + z(G) sqrt((1 - 1/G) / (T k / G))``."""
    if ranks <= 1 or tokens <= 0:
        return 1.0
    mean = tokens * top_k / ranks
    sd = math.sqrt(tokens * top_k * (1.0 / ranks) * (1.0 - 1.0 / ranks))
    return min(float(ranks), (mean + extreme_z(ranks) * sd) / mean)


def remote_ranks_per_token(top_k: int, ranks: int) -> float:
    """``(G - 1)(1 - (1 - 1/G)^k)``: distinct other ranks holding a token's ``k`` experts (uniform placement)."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) * (1.0 - (1.0 - 1.0 / ranks) ** top_k)


def non_expert_bytes(model: ModelArch, dtype: str) -> float:
    """Weight bytes outside the routed experts (attention, dense and shared MLPs, embeddings, head, norms)."""
    return mem.weight_bytes(model, dtype) - routed_expert_bytes(model, dtype)


def routed_expert_bytes(model: ModelArch, dtype: str) -> float:
    """Bytes of all routed experts of all layers at ``dtype`` (scales included)."""
    return model.params.experts * mem.bytes_per_weight(dtype) if model.moe is not None else 0.0


def weights_bytes_per_gpu(model: ModelArch, dtype: str, tp: int, dp: int) -> float:
    """Per-GPU weights of an engine of ``dp`` attention ranks of ``tp`` GPUs (module docstring).

    ``dp = 1`` is :func:`recommender.perf.memory.weights_bytes_per_gpu` (everything over ``tp``); EP or not, the
    routed experts are spread over all ``tp x dp`` GPUs, so only the layout of a step's reads differs."""
    if dp <= 1 or model.moe is None:
        return mem.weights_bytes_per_gpu(model, dtype, tp)
    experts = routed_expert_bytes(model, dtype)
    rest = mem.weights_bytes_per_gpu(model, dtype, tp) - experts / tp
    return rest + experts / (tp * dp)


@dataclass(frozen=True)
class MoeLayout:
    """How one engine spreads a MoE model (module docstring): ``tp`` GPUs per attention rank, ``dp`` ranks, EP or not.

    Built by :meth:`recommender.perf.step.StepCostModel.build`; every time is for one step of the whole engine, and
    ``tokens`` is always the tokens of ONE attention rank (all ranks carry the same load)."""

    tp: int
    dp: int
    ep: bool
    num_experts: int
    top_k: int
    num_moe_layers: int
    num_dense_layers: int
    expert_bytes: float          # one routed expert of one layer, whole (all its shards), at the weight dtype
    hidden_size: int
    link_bytes_per_s: float      # effective one-direction scale-up bandwidth per GPU
    link_latency_s: float

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    def group_tokens(self, tokens: float) -> float:
        """Tokens the MoE layer routes: every attention rank's (``T x dp``)."""
        return tokens * self.dp

    def experts_read_per_gpu(self, tokens: float) -> float:
        """Expert-equivalents of weights one GPU streams per MoE layer (bytes = this x ``expert_bytes``)."""
        tg = self.group_tokens(tokens)
        if self.ep:
            return busiest_rank_experts(self.num_experts, self.top_k, tg, self.gpus)
        return expected_experts_touched(self.num_experts, self.top_k, tg) / self.gpus

    def expert_bytes_read_per_gpu(self, tokens: float) -> float:
        """Routed-expert bytes one GPU streams in one step (all MoE layers)."""
        return self.num_moe_layers * self.experts_read_per_gpu(tokens) * self.expert_bytes

    def imbalance(self, tokens: float) -> float:
        """Busiest rank's routed-token share over the mean (EP); 1 with TP-sharded experts."""
        return routed_imbalance(self.group_tokens(tokens), self.top_k, self.gpus) if self.ep else 1.0

    def all_to_all_s(self, tokens: float) -> float:
        """Dispatch + combine of one MoE layer under DPA: ``2 (latency + T x remote_ranks x hidden x 2 B / bw)``."""
        if self.dp <= 1 or self.gpus <= 1:
            return 0.0
        wire = tokens * remote_ranks_per_token(self.top_k, self.gpus) * self.hidden_size * ACTIVATION_BYTES
        return 2.0 * (self.link_latency_s + wire / self.link_bytes_per_s)

    def dense_ffn_collective_s(self, tokens: float) -> float:
        """All-gather + reduce-scatter of a dense FFN layer over the ``G`` GPUs under DPA."""
        if self.dp <= 1 or self.gpus <= 1:
            return 0.0
        wire = tokens * (self.gpus - 1) * self.hidden_size * ACTIVATION_BYTES
        return 2.0 * (self.link_latency_s + wire / self.link_bytes_per_s)

    def ffn_collectives_s(self, tokens: float) -> float:
        """All FFN-side collectives of one step under DPA (0 without: the step's all-reduce covers them)."""
        return self.num_moe_layers * self.all_to_all_s(tokens) + self.num_dense_layers * self.dense_ffn_collective_s(tokens)




def check_layout(model: ModelArch, gpu_id: str, gpus_per_domain: int, *, tp: int, dp: int, ep: bool,
                 weight_block: tuple[int, int] | None = None, checkpoint: str = "") -> None:
    """Refuse (ConfigError, one line) an EP / DP layout vLLM would not run or that does not fit one scale-up domain:
    EP on a dense model, ``dp < 1``, ``tp x dp`` beyond the GPU's NVLink/xGMI domain, experts that do not split
    evenly over ``tp x dp`` EP ranks, or (DP without EP: vLLM shards every expert's FFN over the ``tp x dp`` GPUs)
    an expert FFN width ``tp x dp`` does not divide; and, for a block-quantized ``checkpoint`` (``weight_block``
    ``(block_n, block_k)``, its config's ``weight_block_size``), a layout whose shards are not whole blocks
    (``recommender.perf.blocks``: vLLM refuses it at load), plain TP included.

    ``tp x dp`` need not divide the domain: a GB200 NVL72 rack runs DP 16 / 32 engines (Dynamo's wide-EP
    deployments, InferenceX's disaggregated rows); how engines pack into rented instances is the offer's
    business (``recommender.offers.fits``: a 16-GPU engine is four 4-GPU trays of one rack)."""
    from recommender.errors import ConfigError

    if dp < 1:
        raise ConfigError(f"--data-parallel-size {dp}: must be at least 1")
    if ep and model.moe is None:
        raise ConfigError(f"--enable-expert-parallel: {model.id} is a dense model (no routed experts); drop the flag")
    g = tp * dp
    if g > gpus_per_domain:
        raise ConfigError(f"--tp {tp} x --data-parallel-size {dp} = {g} GPUs exceeds {gpu_id}'s scale-up domain of "
                          f"{gpus_per_domain} GPUs; use tp x dp <= {gpus_per_domain} and more replicas")
    if ep and model.moe is not None and model.moe.num_experts % g:
        raise ConfigError(f"--enable-expert-parallel over {g} GPUs: {model.id}'s {model.moe.num_experts} experts do not "
                          f"split evenly; use tp x dp dividing {model.moe.num_experts}")
    if dp > 1 and not ep and model.moe is not None and model.moe.expert_intermediate_size % g:
        width = model.moe.expert_intermediate_size
        fits = [d for d in range(1, gpus_per_domain // tp + 1) if width % (tp * d) == 0]
        raise ConfigError(f"--data-parallel-size {dp} with --tp {tp} shards each expert's {width}-wide FFN over {g} GPUs, "
                          f"which does not divide it; add --enable-expert-parallel or use --data-parallel-size "
                          f"{' or '.join(str(d) for d in fits)}")
    check_block_split(model, weight_block, tp=tp, dp=dp, ep=ep, checkpoint=checkpoint)


def balance_wait_s(*, ranks: int, rate_per_rank_per_s: float, timeout_s: float) -> float:
    """Mean extra TTFT of attention-DP prefill balancing: a prompt is held until every one of ``ranks`` attention
    ranks has a prompt to prefill, or ``timeout_s`` passes.

    A round opens with the first held prompt; each of the other ``m = ranks - 1`` ranks receives its first prompt
    after an exponential time of rate ``r`` (Poisson arrivals per rank), so the round lasts ``R = min(T, max of m
    Exp(r))``. The opener waits all of ``R``; the prompts that arrive during it (rate ``lambda = ranks x r``) wait the
    rest of it, so the mean over prompts is ``(E[R] + lambda E[R^2] / 2) / (1 + lambda E[R])``, with::

        E[R]   = integral_0^T 1 - (1 - exp(-r t))^m dt     = sum_{j=1..m} C(m, j) (-1)^(j+1) (1 - exp(-j r T)) / (j r)
        E[R^2] = integral_0^T 2 t (1 - (1 - exp(-r t))^m) dt
               = sum_{j=1..m} C(m, j) (-1)^(j+1) 2 (1 - exp(-j r T) (1 + j r T)) / (j r)^2

    Rare prompts wait the whole timeout (``r -> 0``: ``T``); frequent ones the length-biased half round
    ``E[R^2] / (2 E[R])``."""
    m = ranks - 1
    if m <= 0 or timeout_s <= 0:
        return 0.0
    r, t_max = rate_per_rank_per_s, timeout_s
    if r <= 0:
        return t_max
    e1 = e2 = 0.0
    for j in range(1, m + 1):
        c = math.comb(m, j) * (-1) ** (j + 1)
        x = j * r * t_max
        e1 += c * -math.expm1(-x) / (j * r)
        e2 += c * 2.0 * (1.0 - math.exp(-x) * (1.0 + x)) / (j * r) ** 2
    e1 = min(max(e1, 0.0), t_max)
    e2 = min(max(e2, 0.0), t_max * t_max)
    lam = ranks * r
    return float(min((e1 + lam * e2 / 2.0) / (1.0 + lam * e1), t_max))


__all__ = ["MoeLayout", "expected_experts_touched", "busiest_rank_experts", "routed_imbalance", "extreme_z",
           "remote_ranks_per_token", "weights_bytes_per_gpu", "non_expert_bytes", "routed_expert_bytes", "check_layout",
           "balance_wait_s"]
