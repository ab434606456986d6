"""The typed catalog registry (recommender/catalog.py) and the HF config.json parser (recommender/hf_config.py).

Parameter counts of the config.json fixtures in tests/data/hf_configs/ (see its README) are checked
twice: exactly against a hand count written out below from the config's own numbers, and against the
vendor's published total within the precision the vendor states it. Vendor cards print a few digits
and either round or truncate ("3.3B activated" for 3.353e9), so "matches to the digit shown" means
``stated - unit/2 <= computed < stated + unit`` where ``unit`` is the last digit's place value.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from recommender.catalog import catalog_dir, default_catalog, load_catalog
from recommender.errors import CatalogError, RecommenderError, UnsupportedArchitectureError
from recommender.hf_config import SUPPORTED_MODEL_TYPES, arch_from_config, load_config_file
from recommender.perf import memory as mem

HF = Path(__file__).resolve().parent / "data" / "hf_configs"
H100_YAML = catalog_dir() / "gpus" / "h100-sxm.yaml"
LLAMA_YAML = catalog_dir() / "models" / "llama-3.1-8b.yaml"


def _config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


def matches_stated(computed: float, stated: float, unit: float) -> bool:
    """``computed`` printed to ``unit`` (rounded or truncated) gives ``stated``."""
    return stated - unit / 2 <= computed < stated + unit


# =========================================================================== registry: unknown ids
def test_unknown_gpu_lists_the_valid_ids() -> None:
    cat = default_catalog()
    with pytest.raises(CatalogError) as e:
        cat.gpu("h999")
    msg = str(e.value)
    assert msg.startswith("unknown GPU 'h999'")          # no KeyError-style quoting around the message
    for gpu_id in ("a100-80gb", "h100-sxm", "h200", "l40s", "mi300x"):
        assert gpu_id in msg
    assert "\n" not in msg


def test_unknown_model_lists_the_valid_ids_and_the_config_json_way_out() -> None:
    cat = default_catalog()
    with pytest.raises(CatalogError) as e:
        cat.model("llama-9-70b")
    msg = str(e.value)
    for model_id in ("llama-3.1-70b", "llama-2-7b", "mixtral-8x7b", "deepseek-v3"):
        assert model_id in msg
    assert "config.json" in msg


def test_ids_are_case_insensitive() -> None:
    cat = default_catalog()
    assert cat.gpu("H100-SXM") is cat.gpu("h100-sxm")
    assert cat.model("Llama-3.1-70B") is cat.model("llama-3.1-70b")


def test_catalog_error_is_one_recommender_error_family() -> None:
    # the CLI turns every RecommenderError into one line; CatalogError must be one
    assert issubclass(CatalogError, RecommenderError)


# =========================================================================== registry: files
def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))


def test_an_extra_dir_adds_a_gpu_with_units_converted(tmp_path: Path) -> None:
    doc = yaml.safe_load(H100_YAML.read_text())
    doc.update(id="test-gpu", memory="24 GiB", hbm_bandwidth="1.5 TB/s")
    _write(tmp_path / "gpus" / "test-gpu.yaml", doc)
    cat = load_catalog(extra_dirs=[tmp_path])
    g = cat.gpu("test-gpu")
    assert g.memory_bytes == 24 * 1024**3
    assert g.hbm_bandwidth_bytes_per_s == 1.5e12
    assert g.interconnect.bandwidth_bytes_per_s == 450e9     # "450 GB/s" copied from the H100 file
    assert g.dense_flops_per_s["bf16"] == 989e12
    assert cat.gpu("h100-sxm").memory_bytes == 80e9          # the shipped catalog is still there


def test_duplicate_gpu_id_across_two_dirs_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "gpus").mkdir()
    shutil.copy(H100_YAML, tmp_path / "gpus" / "my-h100.yaml")      # same id: h100-sxm
    with pytest.raises(CatalogError) as e:
        load_catalog(extra_dirs=[tmp_path])
    assert "duplicate GPU id 'h100-sxm'" in str(e.value)
    assert "my-h100.yaml" in str(e.value)


def test_duplicate_model_id_across_two_dirs_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    shutil.copy(LLAMA_YAML, tmp_path / "models" / "copy.yaml")
    with pytest.raises(CatalogError, match="duplicate model id 'llama-3.1-8b'"):
        load_catalog(extra_dirs=[tmp_path])


def test_duplicate_id_is_case_insensitive(tmp_path: Path) -> None:
    doc = yaml.safe_load(H100_YAML.read_text())
    doc["id"] = "H100-SXM"
    _write(tmp_path / "gpus" / "upper.yaml", doc)
    with pytest.raises(CatalogError, match="duplicate GPU id 'h100-sxm'"):
        load_catalog(extra_dirs=[tmp_path])


@pytest.mark.parametrize(
    "field, value",
    [("memory", "80 GX"), ("memory", "eighty GB"), ("hbm_bandwidth", "3.35 TB"), ("hbm_bandwidth", "fast")],
)
def test_gpu_yaml_with_a_bad_unit_is_a_clear_error(tmp_path: Path, field: str, value: str) -> None:
    doc = yaml.safe_load(H100_YAML.read_text())
    doc.update(id="bad-gpu", **{field: value})
    path = tmp_path / "gpus" / "bad-gpu.yaml"
    _write(path, doc)
    with pytest.raises(CatalogError) as e:
        load_catalog(root=tmp_path)
    msg = str(e.value)
    assert field in msg and repr(value) in msg and str(path) in msg
    assert "\n" not in msg


def test_gpu_yaml_with_a_bad_interconnect_unit(tmp_path: Path) -> None:
    doc = yaml.safe_load(H100_YAML.read_text())
    doc["id"] = "bad-link"
    doc["interconnect"]["bandwidth"] = "450 GB"
    _write(tmp_path / "gpus" / "bad-link.yaml", doc)
    with pytest.raises(CatalogError, match="interconnect.bandwidth"):
        load_catalog(root=tmp_path)


def test_gpu_yaml_missing_a_field(tmp_path: Path) -> None:
    doc = yaml.safe_load(H100_YAML.read_text())
    doc["id"] = "no-bw"
    del doc["hbm_bandwidth"]
    _write(tmp_path / "gpus" / "no-bw.yaml", doc)
    with pytest.raises(CatalogError, match="hbm_bandwidth"):
        load_catalog(root=tmp_path)


def test_catalog_file_that_is_not_yaml_or_lacks_an_id(tmp_path: Path) -> None:
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "broken.yaml").write_text("id: [unclosed\n")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(root=tmp_path)
    (tmp_path / "gpus" / "broken.yaml").write_text("name: no id here\n")
    with pytest.raises(CatalogError, match="'id'"):
        load_catalog(root=tmp_path)


# =========================================================================== HF config.json: every family
def test_every_supported_family_has_a_fixture() -> None:
    seen = {json.loads(p.read_text())["model_type"] for p in HF.glob("*/config.json")}
    wanted = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "gpt_oss", "gptj", "falcon"}
    assert wanted <= seen
    assert wanted <= set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("name", sorted(p.parent.name for p in HF.glob("*/config.json")))
def test_model_flag_accepts_a_config_json_path_and_its_folder(name: str) -> None:
    cat = default_catalog()
    by_file = cat.model(str(HF / name / "config.json"))
    by_dir = cat.model(str(HF / name))
    assert by_file == by_dir
    assert by_file.id == name                                   # the folder name, as HF checkouts are named
    assert by_file.total_params > 0


def test_llama_3_1_405b() -> None:
    # hand count from config.json: h=16384, L=126, 128 heads / 8 KV heads x 128, I=53248, vocab 128256, untied
    h, L, hd, v = 16384, 126, 128, 128256
    attn = h * 128 * hd + 2 * h * 8 * hd + 128 * hd * h
    mlp = 3 * h * 53248
    hand = 2 * v * h + L * (attn + mlp + 2 * h) + h
    assert hand == 405_853_388_800
    m = load_config_file(HF / "Llama-3.1-405B-Instruct" / "config.json")
    assert m.total_params == hand
    # Published: HF safetensors total 405,853,388,800 ("Computed totals reproduce vendor totals:
    # Llama-3.1-405B 405,853,388,800", /work/shared/reference/hardware-and-models.md section 2 notes).
    assert m.total_params == 405_853_388_800
    assert mem.kv_cache_bytes_per_token(m, "bf16") == 2 * 126 * 8 * 128 * 2 == 516_096


def test_mistral_7b_v0_3() -> None:
    h, L, v = 4096, 32, 32768
    hand = 2 * v * h + L * (2 * h * h + 2 * h * 8 * 128 + 3 * h * 14336 + 2 * h) + h
    m = load_config_file(HF / "Mistral-7B-Instruct-v0.3" / "config.json")
    assert m.total_params == hand == 7_248_023_552
    # Published: "Mistral 7B is a 7.3B parameter model" (mistral.ai/news/announcing-mistral-7b, for v0.1).
    # v0.1 (vocab 32000) counts 7,241,732,096, v0.3 7,248,023,552: the announcement rounds ~0.7% up, so
    # the stated precision here is 1%, not the last digit.
    assert abs(m.total_params / 7.3e9 - 1) < 0.01
    assert hand - 2 * (32768 - 32000) * h == 7_241_732_096


def test_mixtral_8x7b_total_and_active() -> None:
    h, L, v = 4096, 32, 32000
    attn = 2 * h * h + 2 * h * 8 * 128
    expert = 3 * h * 14336
    hand_total = 2 * v * h + L * (attn + 8 * expert + 8 * h + 2 * h) + h
    hand_active = hand_total - L * 6 * expert                   # top-2 of 8 experts per layer
    m = load_config_file(HF / "Mixtral-8x7B-Instruct-v0.1" / "config.json")
    assert (m.total_params, m.active_params) == (hand_total, hand_active) == (46_702_792_704, 12_879_925_248)
    # Published: "Mixtral has 46.7B total parameters but only uses 12.9B parameters per token"
    # (mistral.ai/news/mixtral-of-experts).
    assert matches_stated(m.total_params, 46.7e9, 0.1e9)
    assert matches_stated(m.active_params, 12.9e9, 0.1e9)


def test_qwen2_5_72b() -> None:
    h, L, v = 8192, 80, 152064
    q, kv = 64 * 128, 8 * 128
    attn = h * q + 2 * h * kv + q * h + q + 2 * kv                # Qwen2 has q/k/v biases
    hand = 2 * v * h + L * (attn + 3 * h * 29568 + 2 * h) + h
    m = load_config_file(HF / "Qwen2.5-72B-Instruct" / "config.json")
    # Published: safetensors parameter count 72,706,203,648 of Qwen2.5-72B-Instruct
    # (hardware-and-models.md table 2b, source [M4]).
    assert m.total_params == hand == 72_706_203_648


def test_qwen3_8b() -> None:
    h, L, v = 4096, 36, 151936
    attn = 2 * h * 32 * 128 + 2 * h * 8 * 128 + 2 * 128           # + q_norm and k_norm (head_dim each)
    hand = 2 * v * h + L * (attn + 3 * h * 12288 + 2 * h) + h
    m = load_config_file(HF / "Qwen3-8B" / "config.json")
    assert m.total_params == hand == 8_190_735_360
    # Published (Qwen/Qwen3-8B model card): "Number of Parameters: 8.2B", "(Non-Embedding): 6.95B";
    # Qwen's non-embedding count leaves out the embedding and the untied head.
    assert matches_stated(m.total_params, 8.2e9, 0.1e9)
    assert matches_stated(m.total_params - m.params.embedding - m.params.lm_head, 6.95e9, 0.01e9)


def test_qwen3_30b_a3b_total_and_active() -> None:
    h, L, v = 2048, 48, 151936
    attn = 2 * h * 32 * 128 + 2 * h * 4 * 128 + 2 * 128
    expert = 3 * h * 768
    hand_total = 2 * v * h + L * (attn + 128 * expert + 128 * h + 2 * h) + h
    hand_active = hand_total - L * 120 * expert                  # top-8 of 128
    m = load_config_file(HF / "Qwen3-30B-A3B" / "config.json")
    assert (m.total_params, m.active_params) == (hand_total, hand_active)
    # Published (Qwen/Qwen3-30B-A3B model card): "30.5B in total and 3.3B activated",
    # "Number of Paramaters (Non-Embedding): 29.9B".
    assert matches_stated(m.total_params, 30.5e9, 0.1e9)
    assert matches_stated(m.active_params, 3.3e9, 0.1e9)         # 3.353e9, printed truncated
    assert matches_stated(m.total_params - m.params.embedding - m.params.lm_head, 29.9e9, 0.1e9)


def test_deepseek_v3_total_active_and_mla_cache() -> None:
    h, _layers, v, heads = 7168, 61, 129280, 128
    q = h * 1536 + 1536 + 1536 * heads * (128 + 64)              # q_a, q_a_layernorm, q_b
    kv = h * (512 + 64) + 512 + 512 * heads * (128 + 128)         # kv_a (+rope), kv_a_layernorm, kv_b
    o = heads * 128 * h
    expert = 3 * h * 2048
    dense_layer = q + kv + o + 3 * h * 18432 + 2 * h
    moe_layer = q + kv + o + 256 * expert + expert + (h * 256 + 256) + 2 * h   # routed + shared + router (+bias)
    hand_total = 2 * v * h + 3 * dense_layer + 58 * moe_layer + h
    hand_active = hand_total - 58 * 248 * expert                  # top-8 of 256 routed
    m = load_config_file(HF / "DeepSeek-V3" / "config.json")
    assert (m.total_params, m.active_params) == (hand_total, hand_active) == (671_026_419_200, 37_552_297_472)
    # Published (deepseek-ai/DeepSeek-V3 README): "671B total parameters with 37B activated for each token"
    # (the MTP module's 14B are excluded, as here).
    assert matches_stated(m.total_params, 671e9, 1e9)
    assert matches_stated(m.active_params, 37e9, 1e9)
    assert m.checkpoint_dtype == "fp8"                            # quantization_config quant_method fp8
    # MLA: one 512 + 64 latent per layer, 61 x 576 x 2 B = 70,272 B/token (hardware-and-models.md 2b)
    assert mem.kv_cache_bytes_per_token(m, "bf16") == 61 * 576 * 2 == 70_272


@pytest.mark.parametrize(
    "name, layers, experts, stated_total, stated_active",
    [("gpt-oss-120b", 36, 128, 117e9, 5.1e9), ("gpt-oss-20b", 24, 32, 21e9, 3.6e9)],
)
def test_gpt_oss(name: str, layers: int, experts: int, stated_total: float, stated_active: float) -> None:
    h, v = 2880, 201088
    attn = h * 64 * 64 + 2 * h * 8 * 64 + 64 * 64 * h + (64 * 64 + 2 * 8 * 64) + h + 64   # biases + sinks
    expert = 3 * h * 2880 + 2 * 2880 + h                           # SwiGLU with biases
    router = h * experts + experts
    hand_total = 2 * v * h + layers * (attn + experts * expert + router + 2 * h) + h
    hand_active = hand_total - layers * (experts - 4) * expert     # top-4
    m = load_config_file(HF / name / "config.json")
    assert (m.total_params, m.active_params) == (hand_total, hand_active)
    # Published (openai/gpt-oss README): "gpt-oss-120b ... (117B parameters with 5.1B active parameters)",
    # "gpt-oss-20b ... (21B parameters with 3.6B active parameters)". OpenAI's active count leaves out
    # the input embedding (a lookup, not a matmul): hardware-and-models.md table 2b.
    assert matches_stated(m.total_params, stated_total, 1e9)
    assert matches_stated(m.active_params - m.params.embedding, stated_active, 0.1e9)
    assert m.checkpoint_dtype == "mxfp4"
    assert m.num_sliding_layers == layers // 2 and m.sliding_window == 128


def test_gpt_j_6b() -> None:
    # EleutherAI/gpt-j-6b: 28 layers, n_embd 4096, 16 heads x 256, n_inner null -> 4 x 4096, vocab 50400,
    # one LayerNorm per layer (parallel attention + MLP), no q/k/v/out biases, MLP with biases,
    # untied lm_head WITH bias, final LayerNorm.
    h, L, v, inner = 4096, 28, 50400, 4 * 4096
    layer = 2 * h + 4 * h * h + (h * inner + inner) + (inner * h + h)
    hand = v * h + L * layer + 2 * h + (v * h + v)
    assert hand == 6_050_882_784
    m = load_config_file(HF / "gpt-j-6b" / "config.json")
    assert m.total_params == hand
    assert (m.num_layers, m.hidden_size, m.num_heads, m.head_dim, m.intermediate_size) == (28, 4096, 16, 256, 16384)
    # Published: n_parameters 6,053,381,344 (EleutherAI/gpt-j-6b model card). The card counts the
    # 8-shard Mesh-Transformer-JAX checkpoint; the gap to the PyTorch model is exactly 7 extra copies of
    # every per-layer LayerNorm (2 x 4096) and MLP-output bias (4096) and of the final LayerNorm, plus
    # one 4096 bias per embedding shard: 7 x (28 x 12288 + 8192) + 8 x 4096 = 2,498,560.
    assert 6_053_381_344 - m.total_params == 7 * (28 * 12288 + 8192) + 8 * 4096
    assert abs(m.total_params / 6_053_381_344 - 1) < 0.0005
    assert mem.kv_cache_bytes_per_token(m, "bf16") == 2 * 28 * 16 * 256 * 2 == 458_752   # MHA


def test_falcon_7b() -> None:
    # tiiuae/falcon-7b: hidden 4544, 32 layers, 71 heads x 64, multi_query (one shared K/V head),
    # parallel_attn (one LayerNorm per layer), no biases, MLP 4 x 4544, vocab 65024, tied embeddings.
    h, L, v = 4544, 32, 65024
    qkv = h * (71 * 64 + 2 * 64)                                   # fused query_key_value: 4544 x 4672
    layer = 2 * h + qkv + h * h + 2 * h * 4 * h
    hand = v * h + L * layer + 2 * h
    assert hand == 6_921_720_704
    m = load_config_file(HF / "falcon-7b" / "config.json")
    assert m.total_params == hand
    assert m.num_kv_heads == 1            # "multi_query": true wins over the legacy "num_kv_heads": 71
    # Published: 6.92B (the project's issue; an independent hand count is the one above)
    assert matches_stated(m.total_params, 6.92e9, 0.01e9)
    # MQA: one K and one V head of 64 per layer
    assert mem.kv_cache_bytes_per_token(m, "bf16") == 2 * 32 * 1 * 64 * 2 == 8_192


# =========================================================================== HF config.json: errors
def test_unsupported_model_type_names_the_field_and_lists_the_supported() -> None:
    cfg = {**_config("Qwen3-8B"), "model_type": "mamba"}
    with pytest.raises(UnsupportedArchitectureError) as e:
        arch_from_config(cfg)
    msg = str(e.value)
    assert "'model_type'" in msg and "'mamba'" in msg
    assert "llama" in msg and "deepseek_v3" in msg and "falcon" in msg


def test_missing_model_type() -> None:
    cfg = _config("Qwen3-8B")
    del cfg["model_type"]
    with pytest.raises(UnsupportedArchitectureError, match="model_type"):
        arch_from_config(cfg)


@pytest.mark.parametrize(
    "fixture, field",
    [
        ("Llama-3.1-405B-Instruct", "num_hidden_layers"),
        ("Llama-3.1-405B-Instruct", "hidden_size"),
        ("Llama-3.1-405B-Instruct", "vocab_size"),
        ("Mixtral-8x7B-Instruct-v0.1", "num_local_experts"),
        ("Qwen3-30B-A3B", "moe_intermediate_size"),
        ("DeepSeek-V3", "kv_lora_rank"),
        ("DeepSeek-V3", "n_routed_experts"),
        ("gpt-j-6b", "n_layer"),
    ],
)
def test_missing_field_is_named(fixture: str, field: str) -> None:
    cfg = _config(fixture)
    del cfg[field]
    with pytest.raises(UnsupportedArchitectureError) as e:
        arch_from_config(cfg)
    assert field in str(e.value)          # named (GPT-2-style names are listed as alternatives)


@pytest.mark.parametrize(
    "field, value",
    [("num_key_value_heads", "eight"), ("intermediate_size", "x"), ("head_dim", [128]),
     ("quantization_config", "fp8"), ("max_position_embeddings", "long"), ("num_hidden_layers", 80.5)],
)
def test_wrong_typed_field_is_an_unsupported_architecture_error(field: str, value: object) -> None:
    cfg = {**_config("Llama-3.1-405B-Instruct"), field: value}
    with pytest.raises(UnsupportedArchitectureError):
        arch_from_config(cfg)


def test_malformed_json_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama", "hidden_size": 4096,')
    with pytest.raises(UnsupportedArchitectureError) as e:
        default_catalog().model(str(p))
    assert "not valid JSON" in str(e.value) and str(p) in str(e.value)


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text("[1, 2, 3]")
    with pytest.raises(UnsupportedArchitectureError, match="JSON object"):
        load_config_file(p)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedArchitectureError, match="does not exist"):
        default_catalog().model(str(tmp_path / "nowhere" / "config.json"))
