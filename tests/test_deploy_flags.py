"""The vLLM 0.33 ``vllm serve`` flag checker (recommender/deploy/vllm_flags.py).

Positive cases are argument lists that the reference notes (reference/vllm/README.md, copied facts in
recommender/data/vllm/README.md) record as *verified to parse* with the real 0.33 parser; negative
cases are ones recorded as rejected (argparse error) or rejected by vLLM's pydantic configs.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recommender.deploy.vllm_flags import VllmFlagError, check_serve_args, flag_table
from recommender.errors import DeployError

NIXL_PRODUCER = '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cuda","kv_connector_extra_config":{"backends":["UCX"]}}'


def test_table_is_the_vllm_0_33_dump() -> None:
    table = flag_table()
    assert table.vllm_version == "0.33.0"
    # 321 actions in the dump, one of them the positional model_tag
    dests = {spec.dest for spec in table.by_name.values()}
    assert len(dests) == 320
    assert "--swap-space" in table.removed and "--num-scheduler-steps" in table.removed
    assert "NixlConnector" in table.kv_connectors and "P2pNcclConnector" not in table.kv_connectors


def test_llm_d_prefill_args_verified_in_reference_parse() -> None:
    # reference README 5.1: llm-d prefill container args, "All these args verified to parse in vLLM 0.33".
    argv = ["openai/gpt-oss-120b", "--disable-access-log-for-endpoints=/health,/metrics,/v1/models",
            "--tensor-parallel-size=1", "--block-size=128", "--kv-transfer-config", NIXL_PRODUCER,
            "--no-disable-hybrid-kv-cache-manager"]
    parsed = check_serve_args(argv)
    assert parsed["model_tag"] == "openai/gpt-oss-120b"
    assert parsed["tensor_parallel_size"] == 1 and parsed["block_size"] == 128
    assert parsed["kv_transfer_config"]["kv_role"] == "kv_producer"
    assert parsed["disable_hybrid_kv_cache_manager"] is False


def test_production_stack_chart_forms_parse() -> None:
    # reference README 4: the chart emits --no-enable-prefix-caching, --gpu_memory_utilization, --max_loras
    parsed = check_serve_args(["m", "--host", "0.0.0.0", "--port", "8000", "--no-enable-chunked-prefill",
                               "--no-enable-prefix-caching", "--gpu_memory_utilization", "0.9", "--max_loras", "4"])
    assert parsed["enable_prefix_caching"] is False and parsed["enable_chunked_prefill"] is False
    assert parsed["gpu_memory_utilization"] == 0.9 and parsed["max_loras"] == 4 and parsed["port"] == 8000


def test_nixl_doc_example_parses() -> None:
    # reference README 5: prefill instance of the NIXL example, with the 0.33 role advice applied
    parsed = check_serve_args(["Qwen/Qwen3-0.6B", "--port", "8100", "--kv-transfer-config",
                               '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_load_failure_policy":"fail"}'])
    assert parsed["kv_transfer_config"]["kv_load_failure_policy"] == "fail"


def test_paired_booleans_give_true_and_false() -> None:
    assert check_serve_args(["m", "--enable-prefix-caching"])["enable_prefix_caching"] is True
    assert check_serve_args(["m", "--disable-prefix-caching"])["enable_prefix_caching"] is False
    assert check_serve_args(["m", "--enforce-eager"])["enforce_eager"] is True
    assert check_serve_args(["m", "--no-enforce-eager"])["enforce_eager"] is False


def test_optimization_level_shorthands() -> None:
    assert check_serve_args(["m", "-O3"])["optimization_level"] == "3"
    assert check_serve_args(["m", "-O", "0"])["optimization_level"] == "0"
    with pytest.raises(VllmFlagError):
        check_serve_args(["m", "-O", "7"])


@pytest.mark.parametrize("flag", sorted(flag_table().removed))
def test_every_removed_flag_is_refused(flag: str) -> None:
    with pytest.raises(VllmFlagError, match="removed"):
        check_serve_args(["m", flag, "1"])


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["m", "--max-num-batched-tokens", "8k"], "plain integer"),   # vLLM would read 8000, not 8192
        (["m", "--max-model-len", "32K"], "plain integer"),
        (["m", "--dtype", "fp8"], "one of"),                           # verified argparse error in the dump
        (["m", "--kv-cache-dtype", "fp4"], "engine start"),
        (["m", "--quantization", "bitsandbytes"], "engine start"),      # not built in to 0.33
        (["m", "--quantization", "gguf"], "engine start"),
        (["m", "--tensor-parallel-size", "two"], "integer"),
        (["m", "--gpu-memory-utilization", "high"], "number"),
        (["m", "--enforce-eager", "true"], "positional"),
        (["m", "--enforce-eager=true"], "no value"),
        (["m", "--tensor-parallel-size"], "expects a value"),
        (["m", "--made-up-flag"], "unknown flag"),
        (["m", "-tp", "2", "--tensor-parallel-size", "4"], "twice"),
        (["m", "--enable-prefix-caching", "--disable-prefix-caching"], "twice"),
        (["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_rank":0}'], "kv_rank"),
        (["m", "--kv-transfer-config", '{"kv_connector":"P2pNcclConnector","kv_role":"kv_producer"}'], "not registered"),
        (["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector"}'], "kv_role"),
        (["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"sender"}'], "kv_role"),
        (["m", "--kv-transfer-config", "{not json"], "JSON"),
        (["m", "--compilation-config", '{"cudagraph_mode":"FULL","no_such_key":1}'], "no_such_key"),
        (["--model", "m"], "model"),
        ([], "no model"),
    ],
)
def test_rejections(argv: list[str], why: str) -> None:
    with pytest.raises(VllmFlagError, match=why):
        check_serve_args(argv)


def test_errors_are_deploy_errors_with_one_line() -> None:
    with pytest.raises(DeployError) as e:
        check_serve_args(["m", "--swap-space", "4"])
    assert "\n" not in str(e.value) and "--swap-space" in str(e.value)


_INT_FLAGS = sorted(n for n, s in flag_table().by_name.items()
                    if s.value_type in ("int", "optional[int]") and s.nargs is None and not s.choices
                    and n.startswith("--") and not s.deprecated)
_CHOICE_FLAGS = sorted((n, s.choices) for n, s in flag_table().by_name.items()
                       if s.choices and s.nargs is None and n.startswith("--") and not s.deprecated)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_INT_FLAGS), st.integers(min_value=0, max_value=10**9))
def test_any_plain_integer_is_accepted_by_int_flags(flag: str, value: int) -> None:
    parsed = check_serve_args(["m", flag, str(value)])
    assert parsed[flag_table().by_name[flag].dest] == value


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_INT_FLAGS), st.text(alphabet="abcxyz.kK", min_size=1, max_size=5))
def test_non_integers_are_refused_by_int_flags(flag: str, value: str) -> None:
    with pytest.raises(VllmFlagError):
        check_serve_args(["m", flag, value])


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(_CHOICE_FLAGS).flatmap(lambda fc: st.tuples(st.just(fc[0]), st.sampled_from(fc[1]))))
def test_every_choice_is_accepted(flag_choice: tuple[str, str]) -> None:
    flag, choice = flag_choice
    check_serve_args(["m", flag, choice])


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_CHOICE_FLAGS), st.text(alphabet="QZqz_", min_size=3, max_size=8))
def test_values_outside_the_choices_are_refused(flag_choices: tuple[str, tuple[str, ...]], junk: str) -> None:
    flag, choices = flag_choices
    if junk in choices or junk.lower() in choices:
        return
    with pytest.raises(VllmFlagError):
        check_serve_args(["m", flag, junk])


def test_served_model_name_takes_several_values() -> None:
    parsed = check_serve_args(["m", "--served-model-name", "a", "b", "--port", "1"])
    assert parsed["served_model_name"] == ["a", "b"] and parsed["port"] == 1


def test_json_flags_return_objects() -> None:
    parsed = check_serve_args(["m", "--compilation-config", json.dumps({"cudagraph_mode": "PIECEWISE"})])
    assert parsed["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}


def test_optional_value_flags() -> None:
    # --hf-token has nargs '?': alone it means "use the cached token", with a value it is the token
    assert check_serve_args(["m", "--hf-token", "--port", "1"])["hf_token"] is None
    assert check_serve_args(["m", "--hf-token", "abc"])["hf_token"] == "abc"
