"""Engine conditions: the scheduler limits, memory fraction and front-end an engine runs a benchmark under.

One layer, used by ``estimate``, ``calibrate`` and the search alike (printed by the first two):

- ``vllm`` / ``sglang``: vLLM 0.33's ``vllm serve`` defaults for the GPU (:func:`default_limits`),
  ``gpu_memory_utilization`` 0.92, the OpenAI API server in front (its per-request cost is the
  profile's ``request_overhead_s`` + ``server_request_overhead_s``);
- ``trtllm``: ``trtllm-bench build``'s heuristics (:func:`trtllm_bench_limits`), the engine's own timer
  (``EngineLimits.engine_timer``: no ``server_request_overhead_s``);
- ``lmdeploy`` / ``gpt-fast``: static-batch benchmarks with generous limits (4096 sequences, 8192
  tokens, 0.95 of memory), the engine's own timer (``engine_timer``).

A static batch of these benchmarks (``gptSessionBenchmark``, LMDeploy ``profile_generation``, gpt-fast) runs its
batch's context in one pass whatever the token budget (:func:`static_batch_limits`). vLLM's
scheduler (``benchmark_latency``, ``LLM.generate``, what the planner deploys) does not: a static batch there shares
each step's ``max_num_batched_tokens`` (``perf.steady``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from recommender.catalog import Gpu
from recommender.hf_config import ModelArch
from recommender.perf import memory as mem
from recommender.perf.step import EngineLimits, default_limits
from recommender.profiles import EngineProfile


@dataclass(frozen=True)
class EngineConditions:
    """What the engine was told and what sits in front of it (see module docstring)."""

    engine: str
    limits: EngineLimits
    gpu_memory_utilization: float
    cuda_graphs: bool
    front_end: str
    request_overhead_s: float
    basis: str                      # where the limits come from, in words

    def lines(self) -> list[str]:
        """The conditions as printed by ``estimate`` and ``calibrate``."""
        lim = self.limits
        return [
            f"engine {self.engine}: max_num_seqs {lim.max_num_seqs}, max_num_batched_tokens {lim.max_num_batched_tokens}, "
            f"chunked prefill {'on' if lim.chunked_prefill else 'off'}, gpu-memory-utilization {self.gpu_memory_utilization:g}, "
            f"CUDA graphs {'on' if self.cuda_graphs else 'off'} ({self.basis})",
            f"front end {self.front_end}: {self.request_overhead_s * 1e3:.2f} ms per request (profile request_overhead_s + server_request_overhead_s)",
        ]


def vllm_limits_basis(gpu: Gpu) -> str:
    gib = gpu.memory_bytes / 1024**3
    rule = ">= 160 GiB" if gib >= 160 else ">= 70 GiB, not A100" if gib >= 70 and not gpu.id.startswith("a100") else "smaller GPU or A100"
    return f"vLLM 0.33 defaults for {gpu.id} ({rule})"


def trtllm_bench_limits(model: ModelArch, gpu: Gpu, tp: int, weight_dtype: str, kv_dtype: str,
                        prompt_tokens: int, output_tokens: int) -> tuple[EngineLimits, float]:
    """``trtllm-bench build``'s engine settings (TensorRT-LLM ``bench/build/tuning.py``, paraphrased).

    KV cache = 0.95 x (GPU memory - weights); requests that fit = KV / (KV bytes of ISL + OSL tokens);
    max_batch_size = that, clamped to [64, 4096]; max_num_tokens = batch x (1 + ISL / OSL) clamped to
    [2048, 32768]. ``gpu_memory_utilization`` is then chosen so that our memory breakdown leaves the
    same KV cache (at most 1.0).
    """
    w = mem.weights_bytes_per_gpu(model, weight_dtype, tp)
    kv_gpu = 0.95 * max(0.0, gpu.memory_bytes - w)
    per_req = mem.kv_bytes_per_sequence(model, kv_dtype, max(prompt_tokens + output_tokens, 1), tp) / tp
    reqs = kv_gpu / per_req if per_req > 0 else 4096.0
    seqs = int(min(4096, max(64, math.ceil(reqs))))
    tokens = int(min(32768, max(2048, math.ceil(seqs * (1 + prompt_tokens / max(output_tokens, 1))))))
    act = mem.activation_peak_bytes_per_gpu(model, tp, tokens, seqs)
    reserve = EngineProfile.runtime_reserve_bytes_per_gpu + EngineProfile.cuda_graph_bytes_per_gpu
    gmu = min(1.0, (kv_gpu + w + act + reserve) / gpu.memory_bytes)
    return EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=tokens, engine_timer=True), gmu


STATIC_LIMITS = EngineLimits(max_num_seqs=4096, max_num_batched_tokens=8192, engine_timer=True)


def static_batch_limits(limits: EngineLimits) -> EngineLimits:
    """The limits a static-batch benchmark of another engine than vLLM ran under: its context phase takes the whole
    batch in one pass (TensorRT-LLM's static batching sizes ``max_num_tokens`` to ``max_batch_size x max_input_len``
    by default; LMDeploy's and gpt-fast's benchmarks prefill the batch together): ``static_prefill_one_pass``."""
    return replace(limits, static_prefill_one_pass=True)


def engine_conditions(engine: str, *, model: ModelArch, gpu: Gpu, tp: int, weight_dtype: str, kv_dtype: str,
                      prompt_tokens: int, output_tokens: int, profile: EngineProfile | None = None) -> EngineConditions:
    """The conditions ``engine`` runs a benchmark of these lengths under (module docstring)."""
    overhead = profile.request_overhead_s if profile is not None else 0.0
    served = overhead + (profile.server_request_overhead_s if profile is not None else 0.0)
    if engine == "trtllm":
        lim, gmu = trtllm_bench_limits(model, gpu, tp, weight_dtype, kv_dtype, prompt_tokens, output_tokens)
        return EngineConditions(engine, lim, gmu, True, "engine timer", overhead,
                                f"trtllm-bench build heuristics for ISL {prompt_tokens} / OSL {output_tokens}")
    if engine in ("lmdeploy", "gpt-fast"):
        return EngineConditions(engine, STATIC_LIMITS, 0.95, True, "engine timer", overhead,
                                "static-batch benchmark, generous limits")
    return EngineConditions(engine, default_limits(gpu), 0.92, True, "OpenAI API server", served,
                            vllm_limits_basis(gpu))


def with_limits(cond: EngineConditions, limits: EngineLimits, basis: str = "given") -> EngineConditions:
    """The same conditions with other limits (flags, a result file's metadata)."""
    import dataclasses

    same = limits == cond.limits
    return dataclasses.replace(cond, limits=limits, basis=cond.basis if same else basis)


__all__ = ["EngineConditions", "engine_conditions", "static_batch_limits", "trtllm_bench_limits", "vllm_limits_basis", "with_limits",
           "STATIC_LIMITS"]
