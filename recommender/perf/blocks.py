"""Block-quantized checkpoints and tensor parallelism: which TP / DP / EP layouts vLLM 0.33 loads them in.

A checkpoint whose ``quantization_config`` has ``weight_block_size: [block_n, block_k]`` (DeepSeek-V3/R1's fp8, Qwen's
``*-FP8`` releases: 128 x 128) stores one scale per ``block_n`` output rows x ``block_k`` input columns of every
linear layer, so vLLM needs every shard a GPU holds to be whole blocks, and refuses at load otherwise:

- ``validate_fp8_block_shape`` (vllm/model_executor/layers/quantization/utils/fp8_utils.py): a column-parallel
  layer's output per shard (q / k / v, gate / up, MLA's q_b / kv_b) a multiple of ``block_n``, a row-parallel
  layer's input per shard (o_proj, down) a multiple of ``block_k`` ("Weight output_partition_size = ... is not
  divisible by weight quantization block_n = 128");
- ``Fp8MoEMethod.create_weights`` (vllm/model_executor/layers/quantization/fp8.py): each routed expert's FFN width
  per shard a multiple of ``block_n``, and (TP > 1) of ``block_k`` ("The output_size of gate's and up's weight = 192
  is not divisible by weight quantization block_n = 128": Qwen3-235B-A22B-FP8 at TP 8, 1536 / 8 = 192; vllm issues
  #17569, #52997).

Shards: attention, dense FFN layers and shared experts are split over the attention rank's ``tp`` GPUs; the routed
experts over ``tp x dp`` without ``--enable-expert-parallel`` (vLLM flattens the MoE group), and not at all with it
(each GPU holds whole experts). Layers vLLM replicates (MLA's q_a / kv_a projections, the router) are not split.
"""

from __future__ import annotations

from recommender.errors import ConfigError
from recommender.hf_config import ModelArch

__all__ = ["block_split_error", "check_block_split", "split_shards"]


def split_shards(model: ModelArch, *, tp: int, dp: int = 1, ep: bool = False) -> list[tuple[str, int, str]]:
    """The per-GPU widths a layout gives the model's split linear layers: (what, width, "out" | "in"), "out" the
    output of a column-parallel layer (checked against ``block_n``), "in" the input of a row-parallel one (``block_k``;
    only where the layer is split, ``tp > 1``)."""
    out: list[tuple[str, int, str]] = []

    def add(what: str, full: int, ways: int, col: bool, row: bool) -> None:
        if col:
            out.append((what, full // ways, "out"))
        if row and ways > 1:
            out.append((what, full // ways, "in"))

    if model.mla is not None:
        m = model.mla
        add("MLA's q_b_proj", model.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), tp, tp > 1, False)
        add("MLA's kv_b_proj", model.num_heads * (m.qk_nope_head_dim + m.v_head_dim), tp, tp > 1, False)
        add("attention's o_proj", model.num_heads * m.v_head_dim, tp, False, True)
    else:
        add("attention's q_proj", model.num_heads * model.head_dim, tp, tp > 1, False)
        if tp > 1:  # K/V heads split, or replicated (one head per GPU) where TP exceeds them
            out.append(("attention's k/v_proj", max(1, model.num_kv_heads // tp) * model.head_dim, "out"))
        add("attention's o_proj", model.num_heads * model.head_dim, tp, False, True)
    moe = model.moe
    if moe is None or moe.num_moe_layers < model.num_layers:
        add("the dense FFN", model.intermediate_size, tp, tp > 1, True)
    if moe is not None:
        if moe.num_shared_experts and moe.shared_intermediate_size:
            add("the shared experts' FFN", moe.shared_intermediate_size * moe.num_shared_experts, tp, tp > 1, True)
        ways = 1 if ep else tp * dp
        # Fp8MoEMethod checks the width per shard against block_n always, against block_k when TP > 1
        out.append(("each routed expert's FFN", moe.expert_intermediate_size // ways, "out"))
        if tp > 1:
            out.append(("each routed expert's FFN", moe.expert_intermediate_size // ways, "in"))
    return out


def block_split_error(model: ModelArch, block: tuple[int, int] | None, *, tp: int, dp: int = 1, ep: bool = False,
                      checkpoint: str = "") -> str | None:
    """None when vLLM loads ``checkpoint`` (weights quantized in ``block`` = (block_n, block_k) blocks; None: not
    block-quantized) at ``--tensor-parallel-size tp --data-parallel-size dp [--enable-expert-parallel]``, else one line:
    what is split too thin, why vLLM refuses it, and what to try (a smaller TP that loads, expert parallelism where
    only the routed experts are too thin, the 16-bit checkpoint where the model has one, quantized at load: per-tensor
    scales, no blocks; ``--checkpoint none``, which ``estimate``, ``simulate`` and ``deploy`` take)."""
    if block is None:
        return None
    bad = _first_bad(model, block, tp=tp, dp=dp, ep=ep)
    if bad is None:
        return None
    what, width, side = bad
    size = block[0] if side == "out" else block[1]
    name = checkpoint or model.hf_repo or model.id
    split = f"TP {tp}" + (f" x DP {dp}" if dp > 1 and "routed" in what and not ep else "")
    tries: list[str] = []
    if dp > 1 and not ep:
        fewer = [d for d in range(dp - 1, 0, -1) if _first_bad(model, block, tp=tp, dp=d, ep=False) is None]
        tries += [f"DP {fewer[0]}"] if fewer else []
    else:
        smaller = [t for t in (64, 32, 16, 8, 4, 2, 1) if t < tp and _first_bad(model, block, tp=t, dp=1, ep=ep) is None]
        tries += [f"TP {smaller[0]}"] if smaller else []
    if (not ep and model.moe is not None and tp * dp > 1 and model.moe.num_experts % (tp * dp) == 0
            and _first_bad(model, block, tp=tp, dp=dp, ep=True) is None):
        tries.append("expert parallelism")
    if model.checkpoint_dtype in ("bf16", "fp16"):  # the model's own checkpoint is 16-bit: the fp8 one is a release
        tries.append(f"the {model.checkpoint_dtype} checkpoint quantized at load (--checkpoint none)")
    try_text = ", ".join(tries[:-1]) + (" or " if len(tries) > 1 else "") + (tries[-1] if tries else "another layout")
    return (f"{name} stores fp8 weights in {block[0]}x{block[1]} blocks and {split} leaves {what} {width} wide "
            f"({'output' if side == 'out' else 'input'} per GPU), not a multiple of {size}: vLLM refuses it at load "
            f"(weight_block_size); use {try_text}")


def check_block_split(model: ModelArch, block: tuple[int, int] | None, *, tp: int, dp: int = 1, ep: bool = False,
                      checkpoint: str = "") -> None:
    """Raise :class:`ConfigError` with :func:`block_split_error`'s line when the layout splits a block."""
    why = block_split_error(model, block, tp=tp, dp=dp, ep=ep, checkpoint=checkpoint)
    if why:
        raise ConfigError(why)


def _first_bad(model: ModelArch, block: tuple[int, int], *, tp: int, dp: int, ep: bool) -> tuple[str, int, str] | None:
    block_n, block_k = block
    for what, width, side in split_shards(model, tp=tp, dp=dp, ep=ep):
        if width % (block_n if side == "out" else block_k):
            return what, width, side
    return None
