"""The typed plan and its one file format: round trip, version-1 files, refusals, CSV per pool, resizing."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from recommender.errors import ConfigError
from recommender.plan import PLAN_VERSION, Plan, PoolRole, dump_plan, load_plan, plan_document, with_replicas
from recommender.render.plan import render_csv, render_table

DATA = Path(__file__).parent / "data" / "plans"
GOLDEN_V2 = Path(__file__).parent / "golden" / "main" / "chat-golden.plan.json"
#: the chat golden as the search wrote it before issue 22's physics (rank 1 h100-sxm TP2, rank 2 TP1 x 2 on one
#: 2-GPU instance): plan arithmetic tests need those shapes, whatever today's search ranks first
ROUND2 = DATA / "chat-golden-round2.plan.json"
GOLDEN_V1 = DATA / "v1" / "chat-golden.plan.json"  # the same search, written by the version-1 writer (its
# "utilisation" updated with the golden when load_utilisation became rate / capacity)
PLAN_FILES = sorted(DATA.glob("*.json")) + [GOLDEN_V1, GOLDEN_V2]


@pytest.mark.parametrize("path", PLAN_FILES, ids=lambda p: p.name)
def test_dump_then_load_is_the_identity(path: Path) -> None:
    plan = load_plan(path)
    text = dump_plan(plan)
    assert json.loads(text)["version"] == PLAN_VERSION == 2
    assert load_plan(text) == plan
    assert load_plan(json.loads(text)) == plan


def test_a_version_1_file_reads_as_the_same_plan_as_version_2() -> None:
    v1, v2 = load_plan(GOLDEN_V1), load_plan(GOLDEN_V2)
    assert [r.id for r in v1.rows] == [r.id for r in v2.rows]
    for a, b in zip(v1.rows, v2.rows):
        assert a.pools == b.pools
        # last-bit float differences between numpy builds (the goldens are compared at rel 1e-6 too)
        assert a.usd_per_million_tokens == pytest.approx(b.usd_per_million_tokens, rel=1e-6)
        assert a.load_utilisation == pytest.approx(b.load_utilisation, rel=1e-6)  # v1 called it "utilisation"
        assert a.ttft_s == pytest.approx(b.ttft_s, rel=1e-6)
    # version 1 did not echo the allowed GPU types, the length distributions' parameters (#31), nor how prices were found
    assert dataclasses.replace(v1.workload, gpus=v2.workload.gpus, prompt_tokens=v2.workload.prompt_tokens,
                               output_tokens=v2.workload.output_tokens) == v2.workload and v1.slos == v2.slos
    assert v1.workload.prompt_tokens is not None and v2.workload.prompt_tokens is not None
    assert dataclasses.replace(v2.workload.prompt_tokens, mean_param=None, std_param=None) == v1.workload.prompt_tokens
    # the version-1 writer knew neither the pricing note, the sizing record (rate_basis, sized_rate_per_s) nor
    # the sensitivity
    assert dataclasses.replace(v1.search, pricing=v2.search.pricing, rate_basis=v2.search.rate_basis,
                               sized_rate_per_s=v2.search.sized_rate_per_s,
                               sensitivity=v2.search.sensitivity) == v2.search
    assert v1.sized_rate_per_s() == pytest.approx(v2.sized_rate_per_s())  # read back from the headroom


def test_version_1_pools_inherit_the_row_settings() -> None:
    # the disaggregated fixture's pools leave enable_prefix_caching / cuda_graphs to the row
    plan = load_plan(DATA / "disagg-llama70b-h200.json")
    row = plan.top
    assert [p.role for p in row.pools] == [PoolRole.PREFILL, PoolRole.DECODE]
    assert row.disaggregated and row.gpu == "h200" and row.tp == 4 and row.gpus_total == 2 * 2 + 1 * 4
    assert row.pools[0].max_num_batched_tokens == 16384 and not row.pools[0].chunked_prefill


def test_the_json_says_gpu_memory_utilization_for_the_engine_and_load_utilisation_for_the_load() -> None:
    doc = json.loads(GOLDEN_V2.read_text())
    row = doc["plans"][0]
    assert "utilisation" not in row and 0 < row["load_utilisation"] < 1
    assert all(p["gpu_memory_utilization"] == 0.92 for p in row["pools"])


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "is not a plan"),
    ('{"name": "x"}', "is not a plan"),
    ('{"version": 3, "workload": {"model": "m"}, "plans": []}', "plan version 3; this recommender reads versions 1, 2"),
    ('{"version": "2", "workload": {"model": "m"}, "plans": []}', "plan version '2'"),
    ("{not json", "not valid JSON (line 1"),
])
def test_foreign_or_future_files_are_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as e:
        load_plan(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_unknown_fields_and_wrong_types_name_the_field() -> None:
    doc = json.loads(GOLDEN_V2.read_text())
    doc["plans"][0]["pools"][0]["replicaz"] = 2
    with pytest.raises(ConfigError, match="field 'plans.0.pools.0.replicaz': Unexpected keyword argument"):
        load_plan(doc)
    doc = json.loads(GOLDEN_V2.read_text())
    doc["plans"][1]["pools"][0]["max_num_seqs"] = "64"
    with pytest.raises(ConfigError, match="field 'plans.1.pools.0.max_num_seqs': Input should be a valid integer"):
        load_plan(doc)
    doc = json.loads(GOLDEN_V2.read_text())
    doc["plans"][0]["tp"] = doc["plans"][0]["pools"][0]["tp"] * 2  # the summary disagrees with its pool
    with pytest.raises(ConfigError, match="says tp .* but its both pool says .*inconsistent"):
        load_plan(doc)


# load_plan is the one validator of plan documents (deploy, simulate --plan and replan --current read through it):
# what vLLM 0.33 would not start (its SchedulerConfig / CacheConfig checks) or no deployment has is refused here
@pytest.mark.parametrize(("changes", "message"), [
    ({"weight_dtype": "int3"}, "pool both: unknown weight_dtype 'int3' (expected one of bf16, fp16, fp8, int8, int4"),
    ({"kv_dtype": "fp16"}, "pool both: unknown kv_dtype 'fp16' (expected bf16 or fp8)"),
    ({"tp": 0}, "tp must be in 1..1024 and replicas in 1..100,000 (got tp=0"),
    ({"replicas": 100_001}, "tp must be in 1..1024 and replicas in 1..100,000 (got tp="),
    ({"max_num_seqs": 0}, "max_num_seqs and max_model_len must be >= 1"),
    ({"max_num_seqs": 2_000_000, "max_num_batched_tokens": 2_000_000}, "out of range"),
    ({"max_num_batched_tokens": 8}, "vLLM requires max_num_batched_tokens (8) >= max_num_seqs"),
    ({"gpu_memory_utilization": 1.01}, "gpu_memory_utilization must be in [0.05, 1], got 1.01"),
])
def test_engines_vllm_would_not_start_are_refused_by_the_reader(changes: dict, message: str) -> None:
    doc = json.loads(GOLDEN_V2.read_text())
    doc["plans"][0]["pools"][0].update(changes)
    doc["plans"][0].update({k: v for k, v in changes.items() if k in ("tp", "replicas")})  # the summary agrees
    with pytest.raises(ConfigError) as e:
        load_plan(doc)
    assert message in str(e.value) and f"plan {doc['plans'][0]['id']!r}" in str(e.value) and "\n" not in str(e.value)


def test_chunked_prefill_off_needs_the_workloads_max_model_len_in_one_step() -> None:
    doc = json.loads(GOLDEN_V2.read_text())
    pool = doc["plans"][0]["pools"][0]
    limit = doc["workload"]["max_model_len"]  # the length vLLM is started with (deploy's --max-model-len)
    pool.update(chunked_prefill=False, max_num_batched_tokens=limit - 1)
    with pytest.raises(ConfigError, match=rf"max_num_batched_tokens \({limit - 1}\) >= max_model_len \({limit}\)"):
        load_plan(doc)
    pool.update(max_num_batched_tokens=limit)
    assert load_plan(doc).rows[0].pools[0].chunked_prefill is False


def test_simulate_plan_refuses_what_deploy_refuses(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from recommender.cli import app

    doc = json.loads(GOLDEN_V2.read_text())
    doc["plans"][0]["pools"][0]["gpu_memory_utilization"] = 1.2
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(app, ["simulate", "--plan", str(path), "--rate", "1", "-n", "50"])
    err = res.stderr.strip()
    assert res.exit_code == 2 and err.startswith("error: ") and "\n" not in err
    assert "gpu_memory_utilization must be in [0.05, 1], got 1.2" in err


def test_missing_and_directory_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_plan(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="is a directory"):
        load_plan(tmp_path)


def test_csv_has_one_line_per_pool() -> None:
    # the version-1 CSV dropped the prefill pool of P/D plans
    plan = load_plan(DATA / "disagg-llama70b-h200.json")
    lines = render_csv(plan).splitlines()
    assert len(lines) == 1 + 2
    assert lines[1].startswith("1,pd-h200-p2x2-d4x1-bf16-fp8,h200,prefill,2,2,4,")
    assert lines[2].startswith("1,pd-h200-p2x2-d4x1-bf16-fp8,h200,decode,4,1,4,")


def test_a_loaded_plan_renders_the_same_table_as_the_searched_one() -> None:
    plan = load_plan(GOLDEN_V2)
    table = render_table(plan)
    assert "llama-3.1-8b | chat-golden: 20 req/s" in table and "h100-sxm" in table
    assert render_table(load_plan(dump_plan(plan))) == table


def test_with_replicas_prices_the_new_pools_and_scales_what_follows_from_gpus() -> None:
    plan = load_plan(ROUND2)
    row = plan.top  # 1 x h100-sxm TP2 at usd_per_gpu_hour p
    price = row.pools[0].usd_per_gpu_hour
    out = with_replicas(plan, (3,), "capped")
    new = out.top
    assert len(out.rows) == 1 and new.rank == 1 and new.replicas == 3 and new.gpus_total == 6
    assert new.usd_per_hour == pytest.approx(price * 2 * 3, abs=1e-4)  # exact: 3 replicas x TP2 x price
    assert new.output_tokens_per_s == pytest.approx(row.output_tokens_per_s * 3, rel=1e-6)
    assert new.load_utilisation == pytest.approx(row.load_utilisation / 3, abs=1e-4)
    assert out.workload.arrival_rate_per_s == pytest.approx(plan.workload.arrival_rate_per_s * 3)
    assert new.id.endswith("-r3") and new.quality_note.endswith("capped")
    assert new.usd_per_million_tokens == row.usd_per_million_tokens  # cost and rate scale together


def test_with_replicas_rents_whole_instances_and_prices_tokens_from_them() -> None:
    plan = load_plan(ROUND2)
    two = plan.row(2)  # h100-sxm TP1 x2 on one runpod instance of 2 GPUs at $5.38/instance-hour
    assert two is not None and two.instances == 1 and two.usd_per_hour == 5.38
    only = dataclasses.replace(plan, rows=(two,))
    up = with_replicas(only, (3,), "").top
    # 3 GPUs need ceil(3 / 2) = 2 instances: 2 x 5.38 = $10.76/h (scaling $/h by GPUs, 5.38 x 3 / 2, gave $8.07/h)
    assert up.instances == 2 and up.usd_per_hour == pytest.approx(10.76)
    # $/M = $/h / (rate x 1244 tokens x 3600 s) x 1e6 at rate 20 x 3 / 2 = 30 req/s: 10.76 / (30 x 1244 x 3600) x 1e6
    assert up.usd_per_million_tokens == pytest.approx(10.76 / (30 * 1244 * 3600) * 1e6, rel=1e-3)
    assert up.usd_per_million_tokens == pytest.approx(two.usd_per_million_tokens * 4 / 3)  # ($/h x 2) / (rate x 1.5)
    assert up.usd_per_million_output_tokens == pytest.approx(two.usd_per_million_output_tokens * 4 / 3)
    down = with_replicas(only, (1,), "").top  # 1 GPU still rents the whole instance: $5.38/h for half the rate
    assert down.instances == 1 and down.usd_per_hour == pytest.approx(5.38)
    assert down.usd_per_million_tokens == pytest.approx(two.usd_per_million_tokens * 2)


def test_with_replicas_without_prices_scales_the_cost() -> None:
    plan = load_plan(DATA / "disagg-llama70b-h200.json")  # pools carry no usd_per_gpu_hour
    out = with_replicas(plan, (3, 1), "")
    assert out.top.pool_replicas == (3, 1) and out.top.gpus_total == 3 * 2 + 4
    assert out.top.usd_per_hour == pytest.approx(50.4 * 10 / 8)


def test_plan_document_is_json_safe_and_keeps_the_summary_keys_for_scripts() -> None:
    plan = load_plan(GOLDEN_V2)
    bad = dataclasses.replace(plan.rows[0], usd_per_hour=float("inf"))
    doc = plan_document(dataclasses.replace(plan, rows=(bad,)))
    json.dumps(doc, allow_nan=False)
    row = doc["plans"][0]
    assert row["usd_per_hour"] is None
    assert {"gpu", "tp", "replicas", "gpus_total", "weight_dtype", "kv_dtype", "disaggregated"} <= set(row)
    edited = copy.deepcopy(doc)
    edited["plans"][0]["max_num_seqs"] = 12345  # a summary key: derived from the pools, so not read back
    assert load_plan(edited).rows[0].main_pool.max_num_seqs == plan.rows[0].main_pool.max_num_seqs


def test_plan_types_are_frozen() -> None:
    plan = load_plan(GOLDEN_V2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rows[0].rank = 2  # type: ignore[misc]
    assert isinstance(plan, Plan)


def test_the_80_column_table_keeps_each_pools_replicas_and_tp_in_the_deployment_cell() -> None:
    # examples/plans/long-context.plan.json (aggregated since P/D pays for its real KV link); at 80 columns the TP and replicas columns are hidden, the deployment cell keeps them
    path = Path(__file__).resolve().parents[1] / "examples" / "plans" / "long-context.plan.json"
    doc = json.loads(path.read_text())
    table = render_table(load_plan(path), width=80)
    body = table.split("\n\n")[1].splitlines()
    assert max(map(len, table.splitlines())) <= 80
    assert "replicas" not in body[0] and " TP " not in body[0]
    for row, line in zip(doc["plans"], body[2:]):
        cells = [f"{p['replicas']}xTP{p['tp']}" for p in row["pools"]]
        want = (f"{row['pools'][0]['gpu']} P {cells[0]} + D {cells[1]}" if len(cells) == 2
                else f"{row['pools'][0]['gpu']} {cells[0]}")
        assert line.split("  ")[0] == str(row["rank"]) and want in line, (want, line)
    # a P/D plan keeps both pools' cells too (tests/data/plans/pd-h100-one-instance.plan.json: `recommend --model
    # llama-3.1-70b --gpus h100 --rate 1 --prompt-tokens 6000 --output-tokens 200 --slo tpot=30ms --trials 40
    # --verify 0 --seed 3 --format json`; rank 1 P 1xTP2 + D 1xTP2 on one instance, rank 3 P 3xTP1 + D 1xTP1)
    pd = Path(__file__).resolve().parent / "data" / "plans" / "pd-h100-one-instance.plan.json"
    body = render_table(load_plan(pd), width=80).split("\n\n")[1].splitlines()
    assert "h100-sxm P 1xTP2 + D 1xTP2" in body[2] and "h100-sxm P 3xTP1 + D 1xTP1" in body[4]


def test_a_data_parallel_row_names_its_ranks_so_the_cell_multiplies_to_the_gpus() -> None:
    """tests/data/plans/moe-dsv3-h200-dp8.json rank 1: 2 engines of TP1 x DP8 on H200 = 16 GPUs (its gpus_total).
    The cell read "h200 2xTP1", two GPUs, beside 16 in the GPUs column. An EP engine says so."""
    from recommender.render.plan import deployment_cell
    from recommender.replan.plans import describe

    plan = load_plan(DATA / "moe-dsv3-h200-dp8.json")
    assert "h200 2xTP1xDP8 " in render_table(plan, width=200).split("\n\n")[1].splitlines()[2]
    assert 2 * 1 * 8 == plan.rows[0].gpus_total
    assert deployment_cell(plan.rows[1].pools) == "h200 3xTP8"  # rank 2: plain TP 8 x 3 replicas
    ep = dataclasses.replace(plan.rows[0].pools[0], enable_expert_parallel=True)
    assert deployment_cell((ep,)) == "h200 2xTP1xDP8 EP"
    assert describe(plan).startswith("h200 tp1 dp8 fp8/bf16 x2 replicas")
    import csv
    import io

    (row, _) = [r for r in csv.DictReader(io.StringIO(render_csv(plan))) if r["rank"] in ("1", "2")]
    assert (row["tp"], row["pp"], row["data_parallel_size"], row["replicas"], row["pool_gpus"]) == ("1", "1", "8", "2", "16")
    assert row["enable_expert_parallel"] == "false" and row["num_speculative_tokens"] == "0"


def test_a_pd_row_across_gpu_types_names_each_pools_gpu() -> None:
    doc = json.loads((DATA / "disagg-llama70b-h200.json").read_text())
    doc["plans"][0]["pools"][0]["gpu"] = "h100-sxm"  # prefill on another GPU type than decode
    doc["plans"][0].pop("gpu", None)
    table = render_table(load_plan(doc), width=80)
    assert "P h100-sxm 2xTP2 + D h200 1xTP4" in table


def test_an_offline_plan_says_when_its_job_ends_and_what_it_costs() -> None:
    # examples/batch-summarization.yaml: 10M requests, deadline 10 h = 36,000 s. The job runs flat out, so it
    # ends at load_utilisation (rate / capacity) x deadline and pays $/h for that long.
    from recommender.render.plan import render_csv

    path = Path(__file__).resolve().parents[1] / "examples" / "plans" / "batch-summarization.plan.json"
    doc = json.loads(path.read_text())
    assert doc["workload"]["deadline_s"] == 36_000.0
    for row in doc["plans"]:
        finish = min(row["load_utilisation"], 1.0) * 36_000.0
        assert row["job"]["finish_s"] == pytest.approx(finish, rel=1e-12)
        assert row["job"]["margin_s"] == pytest.approx(36_000.0 - finish, rel=1e-12)
        assert row["job"]["usd"] == pytest.approx(row["usd_per_hour"] * finish / 3600.0, rel=1e-12)
    plan = load_plan(path)  # the job figures are derived: read back, the plan is the same
    assert load_plan(dump_plan(plan)) == plan
    assert json.loads(dump_plan(plan))["plans"][0]["job"] == doc["plans"][0]["job"]
    lines = render_csv(plan).splitlines()
    header, first = lines[0].split(","), lines[1].split(",")
    assert float(first[header.index("job_usd")]) == pytest.approx(doc["plans"][0]["job"]["usd"], rel=1e-9)
    online = json.loads((path.parent / "chat.plan.json").read_text())
    assert all("job" not in row for row in online["plans"])


def test_a_plan_rows_label_names_its_engine_layout_as_the_searchs_does() -> None:
    # the report's row headings and chart hovers use PlanRow.label; a DP-attention MoE engine with MTP 2 must read as
    # the search's row label (RankedRow.label: 'b200 TP2 DP4 EP MTP2 x1'), not as a plain TP2 engine
    plan = load_plan(Path(__file__).resolve().parents[1] / "examples" / "plans" / "chat.plan.json")
    row = plan.rows[0]
    pool = dataclasses.replace(row.pools[0], gpu="b200", tp=2, replicas=1, data_parallel_size=4,
                               enable_expert_parallel=True, num_speculative_tokens=2)
    assert dataclasses.replace(row, pools=(pool,)).label() == "b200 TP2 DP4 EP MTP2 x1"
    plain = dataclasses.replace(pool, data_parallel_size=1, enable_expert_parallel=False, num_speculative_tokens=0)
    assert dataclasses.replace(row, pools=(plain,)).label() == "b200 TP2 x1"


def test_a_shared_pd_instance_counts_once_and_per_gpu_billing_rents_none() -> None:
    """tests/data/plans/pd-h100-one-instance.plan.json rank 1: P and D on one 8-GPU instance, which both pools' rentals
    name (1 each): the row rents 1 instance, not 2 (the rent column said '1 x runpod 8-GPU (P+D)' beside instances 2).
    GPUs billed at the workload's own per-GPU price rent no instance: the CSV leaves the cell empty."""
    import csv
    import dataclasses
    import io
    from pathlib import Path

    from recommender.plan import load_plan
    from recommender.render.plan import render_csv

    plan = load_plan(Path(__file__).parent / "data" / "plans" / "pd-h100-one-instance.plan.json")
    top = plan.top
    assert [(p.rental.instances, p.rental.shared) for p in top.pools if p.rental] == [(1, True), (1, True)]
    assert top.instances == 1
    cells = [r["instances"] for r in csv.DictReader(io.StringIO(render_csv(plan))) if r["rank"] == "1"]
    assert cells == ["1", "1"]  # each pool's line names the instance it shares
    per_gpu = dataclasses.replace(top.pools[0].rental, shared=False, provider="workload",
                                  offer=dataclasses.replace(top.pools[0].rental.offer, per_gpu_billing=True))
    row = dataclasses.replace(top, pools=(dataclasses.replace(top.pools[0], rental=per_gpu),))
    assert row.instances == 0


def test_a_job_never_finishes_before_one_of_its_requests() -> None:
    """20 requests of 500 output tokens at a 12.85 ms TPOT cannot end in 309 ms: a job's finish is at least one
    request's e2e (plan.cost.job_of), and a job whose requests outlast its deadline is infeasible (exit 4), where it
    had been planned to finish in 309 ms of a 500 ms deadline."""
    import dataclasses

    from recommender.errors import InfeasibleError
    from recommender.plan import WorkloadEcho
    from recommender.plan.cost import job_of
    from recommender.search import SearchSettings, recommend
    from recommender.workload import LengthDist, Workload

    plan = load_plan(Path(__file__).parent.parent / "examples" / "plans" / "batch-summarization.plan.json")
    row = dataclasses.replace(plan.top, load_utilisation=0.01, e2e_s=6.4, usd_per_hour=36.0)
    job = job_of(row, WorkloadEcho(model="llama-3.1-8b", offline_requests=20, deadline_s=100.0))
    assert job is not None and job.finish_s == pytest.approx(6.4) and job.usd == pytest.approx(36.0 * 6.4 / 3600)
    big = job_of(dataclasses.replace(row, load_utilisation=0.5), WorkloadEcho(model="x", offline_requests=10**6,
                                                                              deadline_s=3600.0))
    assert big is not None and big.finish_s == pytest.approx(1800.0)   # throughput-bound: 0.5 x 1 h
    w = Workload(model="llama-3.1-8b", prompt_tokens=LengthDist.constant(1000), output_tokens=LengthDist.constant(500),
                 offline_requests=20, deadline_s=0.5, name="tiny-job")
    with pytest.raises(InfeasibleError, match=r"past the job's 500\.00 ms deadline"):
        recommend(w, settings=SearchSettings(seed=0, verify=0, trials=200))
