"""Checks on the catalog DATA files (catalogs/gpus/*.yaml, catalogs/models/*.yaml).

Loads every file with plain ``yaml.safe_load`` - deliberately NOT through recommender.catalog - so the
data can be validated independently of the loader code. Expected figures are hard-coded from
/work/shared/reference/hardware-and-models.md (section and source tag cited next to each value).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from recommender.catalog import default_catalog

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / "catalogs" / "gpus"
MODEL_DIR = ROOT / "catalogs" / "models"

REQUIRED_GPU_IDS = {
    "a10g", "l4", "l40s", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie",
    "h200", "b200", "gb200", "mi300x", "mi325x",
}
REQUIRED_MODEL_IDS = {
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
    "llama-3.3-70b", "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b", "qwen2.5-72b",
    "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b",
}

_NUM = r"[0-9]+(?:\.[0-9]+)?"
_BYTES_RE = re.compile(rf"^{_NUM} ?(GB|TB)$")
_BW_RE = re.compile(rf"^{_NUM} ?(GB|TB)/s$")
_SCALE = {"GB": 1e9, "TB": 1e12}


def _load_dir(d: Path) -> dict[str, dict]:
    out = {}
    for p in sorted(d.glob("*.yaml")):
        with p.open(encoding="utf-8") as f:
            out[p.stem] = yaml.safe_load(f)
    return out


GPUS = _load_dir(GPU_DIR)
MODELS = _load_dir(MODEL_DIR)


def _bytes(s: str) -> float:
    m = _BYTES_RE.match(s)
    assert m, f"not a 'N GB' string: {s!r}"
    return float(re.match(_NUM, s).group(0)) * _SCALE[m.group(1)]


def _bw(s: str) -> float:
    m = _BW_RE.match(s)
    assert m, f"not a 'N GB/s' string: {s!r}"
    return float(re.match(_NUM, s).group(0)) * _SCALE[m.group(1)]


# --------------------------------------------------------------------------- presence / naming


def test_required_ids_present():
    assert REQUIRED_GPU_IDS <= set(GPUS), REQUIRED_GPU_IDS - set(GPUS)
    assert REQUIRED_MODEL_IDS <= set(MODELS), REQUIRED_MODEL_IDS - set(MODELS)


@pytest.mark.parametrize("kind,data", [("gpus", GPUS), ("models", MODELS)])
def test_ids_match_file_names_and_are_lowercase(kind, data):
    for stem, d in data.items():
        assert isinstance(d, dict), f"{kind}/{stem}.yaml is not a mapping"
        assert d["id"] == stem, f"{kind}/{stem}.yaml has id {d['id']!r}"
        assert stem == stem.lower() and re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", stem), stem


# --------------------------------------------------------------------------- GPUs

KERNELS = yaml.safe_load((ROOT / "catalogs" / "kernel-support.yaml").read_text())
GPU_KEYS = {"id", "name", "vendor", "memory", "hbm_bandwidth", "dense_tflops", "interconnect", "offers", "vllm", "sources", "notes"}
DTYPES = {"bf16", "fp16", "fp8", "int8", "fp4"}
WEIGHT_DTYPES = {"fp8", "int8", "int4", "fp4", "mxfp4"}
FABRICS = {"nvlink3", "nvlink4", "nvlink5", "pcie4", "pcie5", "xgmi"}
TAG_RE = re.compile(r"\[([SPM][0-9]+)")


@pytest.mark.parametrize("gid", sorted(GPUS))
def test_gpu_schema(gid):
    d = GPUS[gid]
    assert GPU_KEYS <= set(d), GPU_KEYS - set(d)
    assert d["vendor"] in {"nvidia", "amd"}
    assert _bytes(d["memory"]) > 0 and _bw(d["hbm_bandwidth"]) > 0
    t = d["dense_tflops"]
    assert set(t) <= DTYPES and {"bf16", "fp16"} <= set(t), set(t)
    assert all(isinstance(v, (int, float)) and v > 0 for v in t.values())
    assert t["fp16"] == t["bf16"]
    if "fp8" in t:
        assert t["fp8"] >= t["bf16"]
    ic = d["interconnect"]
    assert ic["kind"] in FABRICS
    assert _bw(ic["bandwidth"]) > 0 and isinstance(ic["gpus_per_domain"], int)
    if ic["kind"] == "xgmi":
        assert d["vendor"] == "amd" and _bw(ic["peer_bandwidth"]) < _bw(ic["bandwidth"])
    else:
        assert "peer_bandwidth" not in ic
    if ic["kind"].startswith("pcie"):
        assert ic["gpus_per_domain"] == 8
        assert _bw(ic["bandwidth"]) == {"pcie4": 32e9, "pcie5": 64e9}[ic["kind"]]
    offers = d["offers"]
    if not offers:
        assert "price" in d["notes"].lower()  # says why and that a user price is needed
    for o in offers:  # one rentable unit each: provider, GPUs per instance, price, date, source
        assert {"provider", "sku", "gpus_per_instance", "date", "source"} <= set(o), o
        sizes = o["gpus_per_instance"] if isinstance(o["gpus_per_instance"], list) else [o["gpus_per_instance"]]
        assert set(sizes) <= {1, 2, 4, 8}, o
        assert ("usd_per_gpu_hour" in o) != ("usd_per_instance_hour" in o), o
        per_gpu = o.get("usd_per_gpu_hour") or o["usd_per_instance_hour"] / sizes[0]
        assert 0.1 < per_gpu < 50, o
        assert re.fullmatch(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}", o["date"]), o
        assert TAG_RE.search(o["source"]), o["source"]
        for tag in TAG_RE.findall(o["source"]):
            assert tag in d["sources"], f"{gid}: {tag} used in an offer source but missing from sources"
    v = d["vllm"]
    assert v["supported"] is True
    assert v["k8s_resource"] == {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}[d["vendor"]]
    arch = KERNELS["architectures"][v["arch"]]  # every GPU names a row of kernel-support.yaml
    assert arch["vendor"] == d["vendor"]
    assert set(arch["weights"]) <= WEIGHT_DTYPES | {"bf16", "fp16"}
    if "fp4" in t:  # FP4 tensor cores: NVFP4 (Blackwell) or MXFP4 (CDNA4) has a kernel
        assert {"fp4", "mxfp4"} & set(arch["weights"])
    if "fp8" not in t:  # Ampere: no FP8 tensor cores -> FP8 checkpoints run weight-only through Marlin
        assert "W8A16" in arch["weights"]["fp8"] and "Marlin" in arch["weights"]["fp8"]
    for _tag, line in d["sources"].items():
        assert isinstance(line, str) and len(line) > 20


def test_gpu_sources_cover_comment_tags():
    """Every [Sx]/[Px] tag written in a GPU file's comments has its full line in `sources`."""
    for gid in GPUS:
        text = (GPU_DIR / f"{gid}.yaml").read_text(encoding="utf-8")
        body = text.split("\nsources:", 1)[0]
        for tag in set(TAG_RE.findall(body)):
            assert tag in GPUS[gid]["sources"], f"{gid}: tag {tag} not in sources"


# Reference figures, hard-coded from hardware-and-models.md section 1 (GPU table):
#   (memory GB, bandwidth TB/s, BF16 dense TFLOPS, FP8 dense, interconnect one-direction GB/s, GPUs per domain)
REFERENCE_GPUS = {
    "h100-sxm": (80, 3.35, 989, 1979, 450, 8),      # [S1 h100_sxm.yaml]; [S2]; [S3]; [S6]
    "h200": (141, 4.8, 989, 1979, 450, 8),          # [S1 h200_sxm.yaml]; [S10]
    "h100-pcie": (80, 2.0, 756, 1513, 64, 8),       # [S1 h100_pcie.yaml]; PCIe Gen5 64 uni
    "a100-80gb": (80, 2.039, 312, None, 300, 8),    # [S1 a100_sxm.yaml]; [S5]
    "a100-40gb": (40, 1.555, 312, None, 300, 8),    # [S5]
    "l40s": (48, 0.864, 362.05, 733, 32, 8),        # [S8]; [S1 l40s.yaml]
    "l4": (24, 0.300, 121, 242.5, 32, 8),           # [S1 l4.yaml]; [S14]
    "b200": (180, 7.7, 2250, 4500, 900, 8),         # [S1 b200_sxm.yaml]; note: use 7.7 TB/s for HGX B200
    "gb200": (186, 8.0, 2500, 5000, 900, 72),       # [S1 gb200.yaml]; [S2] note 23
    "gb300": (288, 8.0, 2500, 5000, 900, 72),       # hardware-and-models.md: "GB300 (NVL72) per GPU: 8 TB/s, 2.5 PF BF16, 5 PF FP8, 15 PF FP4 dense, ~288 GB"
    "mi300x": (192, 5.3, 1307.4, 2614.9, 448, 8),   # [S4] mi300.md; [S3] 448 aggregate / 64 per peer
    "mi325x": (256, 6.0, 1307.4, 2614.9, 448, 8),   # [S4]; [S12]; [S3]
    "a10g": (24, 0.600, None, None, 32, 8),         # [S13] mem/bw; compute UNCONFIRMED
}


@pytest.mark.parametrize("gid", sorted(REFERENCE_GPUS))
def test_gpu_figures_match_reference(gid):
    mem, bw, bf16, fp8, fabric, domain = REFERENCE_GPUS[gid]
    d = GPUS[gid]
    assert _bytes(d["memory"]) == pytest.approx(mem * 1e9)
    assert _bw(d["hbm_bandwidth"]) == pytest.approx(bw * 1e12)
    if bf16 is not None:
        assert d["dense_tflops"]["bf16"] == pytest.approx(bf16)
    if fp8 is not None:
        assert d["dense_tflops"]["fp8"] == pytest.approx(fp8)
    else:
        assert "fp8" not in d["dense_tflops"]
    assert _bw(d["interconnect"]["bandwidth"]) == pytest.approx(fabric * 1e9)
    assert d["interconnect"]["gpus_per_domain"] == domain


def test_amd_peer_bandwidth_and_fp4_only_where_native():
    # [S3]: MI300X/MI325X 64 GB/s one direction per peer
    for gid in ("mi300x", "mi325x"):
        assert _bw(GPUS[gid]["interconnect"]["peer_bandwidth"]) == pytest.approx(64e9)
    for gid, d in GPUS.items():
        has_fp4 = "fp4" in d["dense_tflops"]
        assert has_fp4 == (gid in {"b200", "gb200", "gb300", "b300", "mi355x"}), gid


def test_offers_follow_reference_table_1b():
    # hardware-and-models.md section 1b (USD per GPU-hour = instance price / GPUs per instance)
    expected = {
        ("h100-sxm", "lambda", 8): 3.99,          # Lambda 8x [P2]/[P3]
        ("h100-sxm", "aws", 8): 55.04 / 8,        # p5.48xlarge $55.04/hr [P1]
        ("h100-sxm", "coreweave", 8): 49.24 / 8,  # HGX H100 $49.24/hr per 8 [P4]
        ("a100-80gb", "lambda", 8): 2.79,         # Lambda 8x [P3]
        ("a100-40gb", "lambda", 8): 1.99,         # Lambda 8x [P3]
        ("b200", "lambda", 8): 6.69,              # Lambda 8x [P3]
        ("b200", "coreweave", 8): 8.60,           # $68.80/hr per 8 [P4]
        ("gb200", "coreweave", 4): 10.50,         # CoreWeave $42.00 / 4 GPUs [P4]
        ("mi300x", "digitalocean", 1): 2.59,      # DigitalOcean [P8]
        ("a10g", "aws", 1): 1.006,                # AWS g5.xlarge [P9]
    }
    cat = default_catalog()
    for (gid, provider, n), usd in expected.items():
        got = [o.usd_per_gpu_hour for o in cat.gpu(gid).offers if o.provider == provider and o.gpus_per_instance == n]
        assert got and got[0] == pytest.approx(usd, rel=1e-9), (gid, provider, n)
    assert not cat.gpu("mi325x").offers and not cat.gpu("mi355x").offers  # UNCONFIRMED in the reference


def test_estimated_figures_are_flagged():
    a10g = GPUS["a10g"]
    assert a10g["estimated"] is True
    assert "dense_tflops.bf16" in a10g["estimated_fields"]
    for gid, d in GPUS.items():
        for field in d.get("estimated_fields", []):
            section, key = field.split(".")
            assert key in d[section], f"{gid}: estimated field {field} does not exist"


# --------------------------------------------------------------------------- models

MODEL_KEYS = {"id", "hf_repo", "checkpoint_dtype", "published", "reference_computed", "config", "sources"}
COMMON_CONFIG = {
    "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings",
    "max_position_embeddings", "rms_norm_eps",
}
PER_TYPE = {
    "llama": set(),
    "mistral": {"sliding_window"},
    "qwen2": set(),  # q/k/v bias is implicit in model_type qwen2 (no attention_bias field in the real config)
    "qwen3": {"head_dim", "attention_bias"},
    "qwen3_moe": {"head_dim", "attention_bias", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob"},
    "mixtral": {"num_local_experts", "num_experts_per_tok"},
    "deepseek_v3": {"n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "first_k_dense_replace", "moe_layer_freq", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                    "qk_nope_head_dim", "v_head_dim", "num_nextn_predict_layers", "quantization_config"},
    "gpt_oss": {"layer_types", "sliding_window", "attention_bias", "head_dim", "quantization_config",
                "num_local_experts", "num_experts_per_tok", "swiglu_limit"},
}
ARCH = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM", "gpt_oss": "GptOssForCausalLM",
}
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


@pytest.mark.parametrize("mid", sorted(MODELS))
def test_model_schema_and_config_fields(mid):
    m = MODELS[mid]
    assert MODEL_KEYS <= set(m), MODEL_KEYS - set(m)
    assert re.fullmatch(r"[A-Za-z0-9\-]+/[A-Za-z0-9.\-_]+", m["hf_repo"])
    assert m["checkpoint_dtype"] in {"bf16", "fp16", "fp8", "mxfp4"}
    c = m["config"]
    mt = c["model_type"]
    assert mt in PER_TYPE, mt
    need = COMMON_CONFIG | PER_TYPE[mt]
    if mt != "gpt_oss":  # the real gpt-oss config.json has no torch_dtype (weights described by quantization_config)
        need = need | {"torch_dtype"}
    assert need <= set(c), f"{mid}: missing {sorted(need - set(c))}"
    assert c["architectures"] == [ARCH[mt]]
    assert c["num_attention_heads"] % c["num_key_value_heads"] == 0
    if m["checkpoint_dtype"] in TORCH_DTYPE:
        assert c["torch_dtype"] == TORCH_DTYPE[m["checkpoint_dtype"]]
        assert "quantization_config" not in c
    pub, ref = m["published"], m["reference_computed"]
    assert {"total_params", "active_params", "source"} <= set(pub)
    assert {"total_params", "active_params", "kv_bytes_per_token_16bit", "source"} <= set(ref)
    assert 0 < ref["active_params"] <= ref["total_params"]
    for tag in TAG_RE.findall(pub["source"]):
        assert tag in m["sources"], f"{mid}: {tag} cited but not in sources"


def test_model_type_specifics():
    ds = MODELS["deepseek-v3"]
    assert ds["checkpoint_dtype"] == "fp8"
    q = ds["config"]["quantization_config"]
    assert q["quant_method"] == "fp8" and q["weight_block_size"] == [128, 128] and q["fmt"] == "e4m3"
    for mid, layers in (("gpt-oss-20b", 24), ("gpt-oss-120b", 36)):
        c = MODELS[mid]["config"]
        assert MODELS[mid]["checkpoint_dtype"] == "mxfp4"
        assert c["num_hidden_layers"] == layers == len(c["layer_types"])
        assert c["layer_types"] == ["sliding_attention", "full_attention"] * (layers // 2)
        assert c["sliding_window"] == 128 and c["attention_bias"] is True and c["head_dim"] == 64
        assert c["quantization_config"]["quant_method"] == "mxfp4"
        assert "lm_head" in c["quantization_config"]["modules_to_not_convert"]
    assert MODELS["mistral-7b"]["config"]["sliding_window"] is None  # v0.3
    for mid in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        c = MODELS[mid]["config"]
        assert c["decoder_sparse_step"] == 1 and c["mlp_only_layers"] == [] and c["num_experts"] == 128
    # Llama-2-13B from the meta-llama/Llama-2-13b-hf config.json
    c = MODELS["llama-2-13b"]["config"]
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"],
            c["intermediate_size"], c["vocab_size"], c["max_position_embeddings"]) == (5120, 40, 40, 40, 13824, 32000, 4096)
    # Llama-3.3-70B = Llama-3.1-70B architecture
    assert MODELS["llama-3.3-70b"]["config"] == MODELS["llama-3.1-70b"]["config"]


# Reference computed counts, hard-coded from hardware-and-models.md table 2b (total, active, KV bytes/token @16-bit)
REFERENCE_2B = {
    "llama-2-7b": (6_738_415_616, 6_738_415_616, 524_288),
    "llama-2-70b": (68_976_648_192, 68_976_648_192, 327_680),
    "llama-3.1-8b": (8_030_261_248, 8_030_261_248, 131_072),
    "llama-3.1-70b": (70_553_706_496, 70_553_706_496, 327_680),
    "llama-3.1-405b": (405_853_388_800, 405_853_388_800, 516_096),
    "llama-3.3-70b": (70_553_706_496, 70_553_706_496, 327_680),
    "mistral-7b": (7_248_023_552, 7_248_023_552, 131_072),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248, 131_072),
    "mixtral-8x22b": (140_620_634_112, 39_152_031_744, 229_376),
    "qwen2.5-7b": (7_615_616_512, 7_615_616_512, 57_344),
    "qwen2.5-72b": (72_706_203_648, 72_706_203_648, 327_680),
    "qwen3-32b": (32_762_123_264, 32_762_123_264, 262_144),
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704, 98_304),
    "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520, 192_512),
    "deepseek-v3": (671_026_419_200, 37_552_297_472, 70_272),
    "gpt-oss-20b": (20_914_757_184, 4_187_440_704, 49_152),
    "gpt-oss-120b": (116_829_156_672, 5_711_982_912, 73_728),
}


@pytest.mark.parametrize("mid", sorted(REFERENCE_2B))
def test_reference_computed_matches_table_2b(mid):
    ref = MODELS[mid]["reference_computed"]
    assert (ref["total_params"], ref["active_params"], ref["kv_bytes_per_token_16bit"]) == REFERENCE_2B[mid]


def _kv_bytes_16bit(c: dict) -> int:
    if c["model_type"] == "deepseek_v3":  # MLA: one compressed latent + rope key per layer
        return c["num_hidden_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * hd * 2


def _params(c: dict) -> tuple[int, int]:
    """(total, active) parameters from config, the reference's method (embeddings + lm_head unless
    tied + attention incl. biases/norms + MLP/experts + router + norms; MTP excluded)."""
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    nh, nkv, mt = c["num_attention_heads"], c["num_key_value_heads"], c["model_type"]
    hd = c.get("head_dim") or H // nh
    embed = V * H * (1 if c["tie_word_embeddings"] else 2) + H  # + final norm
    glu = lambda inter: 3 * H * inter  # noqa: E731 - gate, up, down
    if mt == "deepseek_v3":
        ql, kvl, nope, rope, vd = c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        attn = H * ql + ql + ql * nh * (nope + rope) + H * (kvl + rope) + kvl + kvl * nh * (nope + vd) + nh * vd * H
        dense_layers = c["first_k_dense_replace"]
        moe_layers = L - dense_layers
        E, k, s, mi = c["n_routed_experts"], c["num_experts_per_tok"], c["n_shared_experts"], c["moe_intermediate_size"]
        router = H * E + E  # gate weight + e_score_correction_bias
        base = embed + L * (attn + 2 * H) + dense_layers * glu(c["intermediate_size"]) + moe_layers * (router + s * glu(mi))
        return base + moe_layers * E * glu(mi), base + moe_layers * k * glu(mi)
    attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 2 * H  # q, k, v, o, 2 norms
    if mt == "qwen2":
        attn += nh * hd + 2 * nkv * hd  # q/k/v biases
    if mt in ("qwen3", "qwen3_moe"):
        attn += 2 * hd  # q_norm, k_norm
    if mt == "gpt_oss":
        attn += nh * hd + 2 * nkv * hd + H + nh  # q/k/v/o biases + attention sinks
        E, k, inter = c["num_local_experts"], c["num_experts_per_tok"], c["intermediate_size"]
        expert = H * 2 * inter + 2 * inter + inter * H + H  # gate_up (+bias), down (+bias)
        router = H * E + E
        base = embed + L * (attn + router)
        return base + L * E * expert, base + L * k * expert
    if mt in ("mixtral", "qwen3_moe"):
        E = c.get("num_local_experts") or c["num_experts"]
        k = c["num_experts_per_tok"]
        inter = c["moe_intermediate_size"] if mt == "qwen3_moe" else c["intermediate_size"]
        base = embed + L * (attn + H * E)
        return base + L * E * glu(inter), base + L * k * glu(inter)
    total = embed + L * (attn + glu(c["intermediate_size"]))
    return total, total


@pytest.mark.parametrize("mid", sorted(MODELS))
def test_config_reproduces_reference_computed_counts(mid):
    """The config block is exact enough to reproduce the reference's parameter and KV counts."""
    m = MODELS[mid]
    c, ref = m["config"], m["reference_computed"]
    assert _kv_bytes_16bit(c) == ref["kv_bytes_per_token_16bit"]
    assert _params(c) == (ref["total_params"], ref["active_params"])
