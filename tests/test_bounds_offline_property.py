"""Property: for offline jobs of any shape the search's cost bound never exceeds an evaluation (slow).

An offline job prices its tokens at the pools' saturation rate (``recommender.sizing``: ``usd_per_hour x rate /
saturation``), so its bound holds only if each pool's throughput bound is at least what the load model sustains
(``recommender.search.bounds``). The random-evaluation test in ``test_search_shapes.py`` checks fixed jobs; this
draws the job: model, prompt and output means and spreads, and the deadline. Found by that test on 2026-12-06: a
pool at 16 sequences ran past ``16 / decode_step_s(16)`` because the load model prices its step at the batch a
decoder sees, at most ``c - 1`` decoders a step (then in every pool; now where a slot prefills). With the bound's
step at ``c`` this test falsifies it too (40 jobs, 2026-12-06: Qwen3-30B-A3B, 64-token prompts, 1,038 output tokens, A100-40GB TP2 x DP2 bf16 at 16
sequences, evaluation 0.95066 under a bound of 0.95097; after the decode pool's fix in the load model, L40S TP1 fp8
at 16 sequences); at ``c - 1`` it passes (80 s). The draws and checks are ``bound_checks.random_bound_checks``."""

from __future__ import annotations

import pytest
from bound_checks import context_of, random_bound_checks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

JOB = """
name: drawn
model: {model}
traffic: {{offline: {{requests: {requests}, deadline: {hours}h}}}}
prompt_tokens: {{dist: lognormal, mean: {prompt}, std: {prompt_sd}, min: 16, max: 16000}}
output_tokens: {{dist: lognormal, mean: {output}, std: {output_sd}, min: 2, max: 4000}}
"""


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "mixtral-8x7b"]),
       prompt=st.integers(64, 6000), output=st.integers(8, 2000), spread=st.floats(0.1, 0.6),
       requests_k=st.integers(50, 2000), hours=st.integers(2, 24), seed=st.integers(0, 1000))
def test_offline_cost_bound_never_exceeds_an_evaluation(tmp_path, model, prompt, output, spread, requests_k, hours,
                                                        seed) -> None:
    ctx = context_of(tmp_path, JOB.format(model=model, requests=f"{requests_k}k", hours=hours, prompt=prompt,
                                          prompt_sd=max(1, int(prompt * spread)), output=output,
                                          output_sd=max(1, int(output * spread))))
    assert random_bound_checks(ctx, 80, seed, latencies=False) > 0
