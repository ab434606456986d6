"""Benchmark results -> :class:`Measurement` rows: the published-measurements CSV and ``vllm bench serve`` JSON.

Published CSV (columns of ``tests/data/measurements/published.csv``): one metric per row. How a row
becomes a load (stated assumptions; see ``tests/data/measurements/README.md``):

- ``batch_or_concurrency`` = ``max ...`` (``trtllm-bench throughput`` at infinite rate): ``Load("max")``,
  the batch is whatever the KV cache holds under the engine's limits;
- ``concurrency N`` / ``request_rate`` = ``closed-loop``: ``Load("closed", N)``;
- otherwise a static batch (``profile_generation``, ``gptSessionBenchmark``, gpt-fast): ``Load("static", B)``.

Engine conditions (:data:`ENGINE_CONDITIONS`): ``trtllm-bench build``'s own settings for TensorRT-LLM
(KV cache = 0.95 x the memory the weights leave, max batch = the requests that fit, max tokens = batch x
(1 + ISL / OSL); see :func:`_trt_conditions`); vLLM's own defaults for the GPU; LMDeploy and gpt-fast
run static batches where limits do not matter. An unstated KV dtype follows the weights (FP8 recipes
quantize the KV cache, 16-bit engines keep it 16-bit); gpt-fast's unstated output
length is its ``generate.py`` default of 200 tokens.

``vllm bench serve --save-result`` JSON (one object, or one per line with ``--append-result``): the
run's model, GPU and TP (and ``data_parallel_size``, ``enable_expert_parallel``: 1 and off where not stated) come
from the file's metadata keys (``--metadata model=... gpu=H100 tp=1``), else the sidecar ``<file>.yaml`` (or
``<stem>.yaml``), else the caller's defaults (CLI flags); prompt and output lengths are ``total_input_tokens /
completed`` and ``total_output_tokens / completed``.
Each file gives up to three measurements: ``output_throughput``, the mean (else median) TTFT and TPOT (never ITL:
it is one value per streamed chunk, which with speculative decoding or ``--stream-interval`` > 1 carries several
tokens).

A run the model cannot describe is skipped with its reason (:func:`unmodelled_run`), the other files are used:
pipeline-parallel serving, a data- / expert-parallel layout vLLM would not run (``perf.moe.check_layout``'s reason),
speculative decoding other than the model's MTP heads or without its config and counters (:func:`_speculation`),
and a run with failed requests. A data- or expert-parallel run is predicted as ``recommend estimate`` predicts that
layout; an MTP run at the per-position acceptance its ``spec_decode_*`` counters give.
A result whose rows repeat an earlier file's (a copy under another name) is skipped too: held out, it would be
predicted by a fit that saw its twin.
"""

from __future__ import annotations

import csv
import json
import math
import os
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from recommender.bounded import load_json_text, read_file_text
from recommender.calibrate.measurements import (
    MAX_CALIBRATION_REQUESTS, MAX_CALIBRATION_TOKENS_ENV, Measurement, Skip, max_calibration_tokens, parse_metric,
    resolve_gpu, resolve_model,
)
from recommender.catalog import Catalog, default_catalog
from recommender.estimator import native_weight_dtype, parse_speculative_config
from recommender.errors import CalibrationError, ConfigError, RecommenderError
from recommender.hf_config import ModelArch
from recommender.perf.conditions import engine_conditions, static_batch_limits
from recommender.perf.moe import check_layout
from recommender.perf.speculative import SpecDecode, acceptance_for
from recommender.perf.steady import Load
from recommender.perf.step import EngineLimits, default_limits
from recommender.yamlfile import load_yaml_text

CSV_COLUMNS = ("id", "model", "gpu", "tp", "weight_dtype", "kv_dtype", "engine", "isl", "osl",
               "batch_or_concurrency", "request_rate", "metric", "value")
#: gpt-fast ``generate.py --max_new_tokens`` default, used when a gpt-fast row does not state its output length.
GPT_FAST_DEFAULT_OUTPUT_TOKENS = 200


@dataclass(frozen=True)
class ReadResult:
    """Measurements read from some files, and what was skipped (with reasons)."""

    measurements: tuple[Measurement, ...] = ()
    skipped: tuple[Skip, ...] = ()
    files: tuple[str, ...] = ()

    def __add__(self, other: "ReadResult") -> "ReadResult":
        return ReadResult(self.measurements + other.measurements, self.skipped + other.skipped, self.files + other.files)


# -- dtypes and engines ---------------------------------------------------------------------------
_WEIGHT_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp8": "fp8", "float8": "fp8", "fp8_e4m3": "fp8", "w8a8-fp8": "fp8", "int8": "int8", "w8a8": "int8",
    "int4": "int4", "awq": "int4", "gptq": "int4", "w4a16": "int4", "fp4": "fp4", "nvfp4": "fp4", "mxfp4": "mxfp4",
}


def weight_dtype_of(text: str | None, native: str) -> str | None:
    """'fp8', 'int8 weight-only', 'bf16 (unquantized checkpoint)', 'unknown (checkpoint default)' -> dtype."""
    if text is None or not str(text).strip() or str(text).strip().lower() in ("auto", "none"):
        return native
    t = str(text).strip().lower()
    if t.startswith("unknown"):
        if "bf16" in t or "unquantized" in t or "checkpoint default" in t:
            return native if "checkpoint default" in t else "bf16"
        return None
    head = re.split(r"[\s(,;]", t)[0]
    return _WEIGHT_ALIASES.get(head)


def kv_dtype_of(text: str | None, weight_dtype: str) -> str | None:
    """'fp8 (...)', 'bf16', 'auto', 'unknown (FP16 benchmark ...)' -> 'fp8' | 'bf16'.

    Unstated: FP8 weights imply an FP8 KV cache (the TensorRT-LLM FP8 recipe), else 16-bit."""
    t = "" if text is None else str(text).strip().lower()
    if not t or t in ("auto", "none") or t.startswith("unknown"):
        return "fp8" if weight_dtype == "fp8" else "bf16"
    head = re.split(r"[\s(,;]", t)[0]
    if head.startswith("fp8") or head.startswith("float8"):
        return "fp8"
    if head in ("bf16", "fp16", "bfloat16", "float16", "half", "auto"):
        return "bf16"
    return None


def engine_of(text: str) -> str:
    t = text.strip().lower()
    for key, name in (("trtllm", "trtllm"), ("tensorrt", "trtllm"), ("lmdeploy", "lmdeploy"), ("gpt-fast", "gpt-fast"),
                      ("sglang", "sglang"), ("vllm", "vllm")):
        if t.startswith(key):
            return name
    return re.split(r"[\s(]", t)[0] or "vllm"


def _conditions(engine: str, cat: Catalog, model: str, gpu: str, tp: int, wd: str, kd: str, isl: int, osl: int
                ) -> tuple[EngineLimits, float]:
    """(limits, gpu_memory_utilization) the engine benchmarked under (``perf.conditions``, one layer)."""
    c = engine_conditions(engine, model=cat.model(model), gpu=cat.gpu(gpu), tp=tp, weight_dtype=wd, kv_dtype=kd,
                          prompt_tokens=isl, output_tokens=osl)
    return c.limits, c.gpu_memory_utilization


# -- published CSV --------------------------------------------------------------------------------
def _first_int(text: str) -> int | None:
    m = re.search(r"\d[\d,]*", text.replace(",", ""))
    return int(m.group(0)) if m and not text.strip().lower().startswith("unknown") else None


def _row_measurement(row: Mapping[str, str], where: str, cat: Catalog) -> Measurement | Skip:
    rid = row["id"].strip()
    source = rid.rsplit("-", 1)[0] if "-" in rid else rid
    model = resolve_model(row["model"], cat)
    if model is None:
        return Skip(rid, f"model {row['model']!r} not in the catalog")
    gpu = resolve_gpu(row["gpu"], cat)
    if gpu is None:
        return Skip(rid, f"GPU {row['gpu']!r} not in the catalog")
    tp = _first_int(row["tp"])
    if tp is None:
        return Skip(rid, f"tp {row['tp']!r} not stated")
    engine = engine_of(row["engine"])
    wd = weight_dtype_of(row["weight_dtype"], native_weight_dtype(cat.model(model)))
    if wd is None:
        return Skip(rid, f"weight dtype {row['weight_dtype']!r} unknown")
    kd = kv_dtype_of(row["kv_dtype"], wd)
    if kd is None:
        return Skip(rid, f"KV dtype {row['kv_dtype']!r} unknown")
    try:
        quantity, unit, scale = parse_metric(row["metric"], f"{where} row {rid} field 'metric'")
    except CalibrationError as e:  # one row the model cannot predict is skipped, not fatal to the file
        return Skip(rid, str(e).split(": ", 1)[-1])
    try:
        value = float(row["value"].replace(",", "")) * unit
    except ValueError:
        raise CalibrationError(f"{where} row {rid}: field 'value' {row['value']!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise CalibrationError(f"{where} row {rid}: field 'value' must be a positive number, got {row['value']!r}")
    bc, rate = row["batch_or_concurrency"].strip().lower(), row["request_rate"].strip().lower()
    isl = _first_int(row["isl"])
    osl = _first_int(row["osl"])
    if osl is None and engine == "gpt-fast":
        osl = GPT_FAST_DEFAULT_OUTPUT_TOKENS
    if quantity in ("itl_intercept_s", "itl_slope_s_per_token"):
        load = Load.context(batch=1, context_tokens=1)
    else:
        if isl is None or osl is None:
            return Skip(rid, f"input/output length not stated (isl {row['isl']!r}, osl {row['osl']!r})")
        n = _first_int(bc)
        if bc.startswith("max"):
            load = Load.offline_max(prompt_tokens=isl, output_tokens=osl)
        elif n is None:
            return Skip(rid, f"batch/concurrency {row['batch_or_concurrency']!r} not stated")
        elif "concurrency" in bc or "closed" in rate:
            load = Load.closed(concurrency=n, prompt_tokens=isl, output_tokens=osl)
        else:
            load = Load.static(batch=n, prompt_tokens=isl, output_tokens=osl)
    if scale == "gpu":
        value *= tp
    elif scale == "user":
        value *= load.batch if load.mode in ("static", "closed") else 1
    try:
        limits, gmu = _conditions(engine, cat, model, gpu, tp, wd, kd, load.prompt_tokens or 1, load.output_tokens or 1)
    except RecommenderError as e:
        return Skip(rid, str(e))
    if load.mode == "static" and engine != "vllm":  # gptSessionBenchmark, profile_generation, gpt-fast: one pass
        limits = static_batch_limits(limits)
    return Measurement(id=rid, source=source, file=where, engine=engine, model=model, gpu=gpu, tp=tp,
                       weight_dtype=wd, kv_dtype=kd, load=load, quantity=quantity, value=value,
                       raw_metric=row["metric"].strip(), limits=limits, gpu_memory_utilization=gmu)


def _read_results(p: Path, what: str = "results file") -> str:
    """A results file through the bounded reader; its errors become CalibrationError (one line)."""
    try:
        return read_file_text(p, what)
    except ConfigError as e:
        raise CalibrationError(str(e)) from None


def read_published_csv(path: str | Path, catalog: Catalog | None = None) -> ReadResult:
    """Read a CSV in the published-measurements format; rows the catalog cannot model are skipped with a reason."""
    p = Path(path)
    cat = catalog or default_catalog()
    text = _read_results(p)
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise CalibrationError(f"{p}: CSV lacks column(s) {', '.join(missing)} "
                               f"(needs {', '.join(CSV_COLUMNS)}; see tests/data/measurements/published.csv)")
    ms: list[Measurement] = []
    skips: list[Skip] = []
    for i, row in enumerate(reader, start=2):
        if not any((v or "").strip() for v in row.values()):
            continue
        rid = str(row.get("id") or f"line {i}").strip()
        empty = [c for c in CSV_COLUMNS if row.get(c) is None or not str(row[c]).strip()]
        if empty:  # one bad row is skipped with its reason, not fatal to the file
            skips.append(Skip(rid, f"{p} line {i}: field {empty[0]!r} is empty"))
            continue
        try:
            r = _row_measurement(row, str(p), cat)
        except CalibrationError as e:
            r = Skip(rid, str(e))
        (ms if isinstance(r, Measurement) else skips).append(r)  # type: ignore[arg-type]
    return ReadResult(tuple(ms), tuple(dataclasses.replace(s, file=str(p), unit="row") for s in skips), (str(p),))


# -- vllm bench serve JSON ------------------------------------------------------------------------
#: Field -> keys accepted for it in the file's metadata, the sidecar YAML or the defaults (first wins).
FIELD_KEYS: Mapping[str, tuple[str, ...]] = {
    "model": ("model", "catalog_model"),
    "gpu": ("gpu", "gpu_type", "accelerator"),
    "tp": ("tp", "tensor_parallel_size", "tensor-parallel-size"),
    "dp": ("dp", "data_parallel_size", "data-parallel-size"),
    "ep": ("ep", "enable_expert_parallel", "enable-expert-parallel", "expert_parallel"),
    "speculative_config": ("speculative_config", "speculative-config"),
    "weight_dtype": ("weight_dtype", "quantization"),
    "kv_dtype": ("kv_dtype", "kv_cache_dtype", "kv-cache-dtype"),
    "engine": ("engine",),
    "max_num_seqs": ("max_num_seqs", "max-num-seqs"),
    "max_num_batched_tokens": ("max_num_batched_tokens", "max-num-batched-tokens"),
    "gpu_memory_utilization": ("gpu_memory_utilization", "gpu-memory-utilization"),
    "chunked_prefill": ("chunked_prefill", "enable_chunked_prefill"),
    "prompt_tokens": ("prompt_tokens", "input_len", "random_input_len"),
    "output_tokens": ("output_tokens", "output_len", "random_output_len"),
}
BENCH_REQUIRED_KEYS = ("completed", "total_input_tokens", "total_output_tokens", "output_throughput")


def _sidecar(path: Path) -> dict[str, Any]:
    """The sidecar YAML next to a result (``<file>.yaml``, ``<stem>.yaml``, ``.yml``): a mapping of :data:`FIELD_KEYS`'
    keys, each once (a key given twice, or one it does not know, is refused: it would silently pick a value)."""
    for cand in (Path(str(path) + ".yaml"), path.with_suffix(".yaml"), Path(str(path) + ".yml"), path.with_suffix(".yml")):
        if cand.exists() and cand != path:
            try:
                doc = load_yaml_text(_read_results(cand, "sidecar"))
            except yaml.YAMLError as e:
                context = getattr(e, "context", None)
                why = context if context and str(context).startswith("duplicate key") else str(e).splitlines()[0]
                raise CalibrationError(f"sidecar {cand} is not valid YAML: {why}") from None
            if doc is None:
                return {}
            if not isinstance(doc, dict):
                raise CalibrationError(f"sidecar {cand} must be a mapping of fields (model, gpu, tp, ...)")
            known = {k for keys in FIELD_KEYS.values() for k in keys}
            unknown = sorted(str(k)[:40] for k in doc if k not in known)
            if unknown:
                raise CalibrationError(f"sidecar {cand}: unknown key(s) {', '.join(repr(k) for k in unknown[:5])}; it "
                                       f"takes {', '.join(sorted(FIELD_KEYS))} (or their vLLM spellings)")
            return doc
    return {}


def _lookup(field_name: str, layers: Iterable[tuple[str, Mapping[str, Any]]]) -> tuple[Any, str] | None:
    """The first layer's value of ``field_name`` (file, then sidecar, then flags) and the layer's label; two of its
    spellings with different values in one layer (``dp: 2`` beside ``data_parallel_size: 8``) are refused: either
    would be a silent pick."""
    for label, layer in layers:
        given = [(k, layer[k]) for k in FIELD_KEYS[field_name] if layer.get(k) not in (None, "")]
        differ = [(k, v) for k, v in given if str(v).strip().lower() != str(given[0][1]).strip().lower()] if given else []
        if differ:
            (k1, v1), (k2, v2) = given[0], differ[0]
            raise CalibrationError(f"{label}: {k1}={str(v1)[:40]!r} and {k2}={str(v2)[:40]!r} give field {field_name!r} "
                                   "two values; keep one")
        if given:
            return given[0][1], label
    return None


#: What a boolean metadata field may say (vLLM writes ``true`` / ``false``; ``--metadata`` passes text).
_BOOLEAN_WORDS = {"true": True, "1": True, "yes": True, "on": True, "y": True, "t": True,
                  "false": False, "0": False, "no": False, "off": False, "n": False, "f": False}


def _bool_field(v: Any, name: str, where: str) -> bool:
    """A boolean field (a bool, 0 / 1, or one of :data:`_BOOLEAN_WORDS`), else one line naming it: an unknown word
    read as true would fit the run as a layout it did not have."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    word = str(v).strip().lower() if isinstance(v, (str, int, float)) else None
    if word is None or word not in _BOOLEAN_WORDS:
        raise CalibrationError(f"{where}: field {name!r} = {str(v)[:40]!r} is not true or false")
    return _BOOLEAN_WORDS[word]


def _int_field(v: Any, name: str, where: str) -> int:
    """An integer field (a number or its string), else one line naming it."""
    if isinstance(v, bool):
        raise CalibrationError(f"{where}: field {name!r} = {v!r} is not an integer")
    try:
        f = float(str(v).strip())
    except ValueError:
        raise CalibrationError(f"{where}: field {name!r} = {str(v)[:40]!r} is not an integer") from None
    if not math.isfinite(f) or f != int(f) or abs(f) > 1e15:
        raise CalibrationError(f"{where}: field {name!r} = {str(v)[:40]!r} is not an integer")
    return int(f)


def _float_field(v: Any, name: str, where: str) -> float:
    """A finite number field (a number or its string), else one line naming it."""
    try:
        f = float(str(v).strip()) if not isinstance(v, bool) else math.nan
    except ValueError:
        f = math.nan
    if not math.isfinite(f):
        raise CalibrationError(f"{where}: field {name!r} = {str(v)[:40]!r} is not a finite number")
    return f


def _number(doc: Mapping[str, Any], key: str, where: str) -> float:
    if key not in doc:
        raise CalibrationError(f"{where}: missing field {key!r} (is this a `vllm bench serve --save-result` file?)")
    v = doc[key]
    if key == "request_rate" and isinstance(v, str) and v.strip().lower() == "inf":
        return math.inf  # vllm bench serve writes "inf" for all-at-once
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise CalibrationError(f"{where}: field {key!r} must be a finite non-negative number, got {str(v)[:40]!r}")
    return float(v)


#: Metadata keys (``vllm bench serve --metadata KEY=VALUE``) of a server layout the model does not predict: an
#: integer above 1 makes the run unusable. (Data and expert parallelism are read: ``FIELD_KEYS`` ``dp`` and ``ep``.)
_PIPELINE_KEYS = ("pp", "pipeline_parallel_size", "pipeline-parallel-size")
#: Metadata keys that say a run decoded speculatively without giving its config (method and k).
_SPEC_HINTS = ("spec_method", "spec-method", "num_speculative_tokens", "spec_tokens", "spec-tokens")


def _truthy(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v != 0
    return str(v).strip().lower() not in ("", "0", "false", "no", "off", "none", "null")


def unmodelled_run(doc: Mapping[str, Any]) -> str | None:
    """Why a ``vllm bench serve`` result cannot be fitted (None: it can).

    - pipeline parallelism in the metadata (stages over several instances: calibrate predicts one instance);
    - failed requests: throughput and latencies count only the completed ones.

    Data- and expert-parallel runs are read (``dp``, ``ep``) and predicted as ``recommend estimate
    --data-parallel-size / --enable-expert-parallel`` predicts them; MTP runs with their acceptance
    (:func:`_speculation`)."""
    for k in _PIPELINE_KEYS:
        if k in doc and doc[k] not in (None, ""):
            try:
                n = float(str(doc[k]).strip())
            except ValueError:
                return f"pipeline parallel metadata {k}={str(doc[k])[:20]!r} is not a number"
            if n > 1:
                return (f"pipeline parallel serving ({k}={doc[k]}): calibrate predicts one instance's engine; "
                        f"calibrate on a run with pipeline_parallel_size=1")
    failed = doc.get("failed")
    if isinstance(failed, (int, float)) and not isinstance(failed, bool) and math.isfinite(failed) and failed > 0:
        total = doc.get("num_prompts")
        of = f" of {total}" if isinstance(total, int) and not isinstance(total, bool) else ""
        return (f"{failed:g}{of} requests failed: its throughput and latencies count only the completed ones; "
                f"fix the cause and rerun it")
    return None


def _speculation(doc: Mapping[str, Any], layers: Iterable[tuple[str, Mapping[str, Any]]], arch: ModelArch,
                 where: str) -> SpecDecode | None | str:
    """A run's MTP speculative decoding (None: none; a string: why it cannot be read). The method and ``k`` come from
    the speculative config in the metadata or sidecar (``--metadata speculative_config='{"method": "mtp", ...}'``,
    vLLM 0.33's JSON, checked as ``estimate --speculative-config`` checks it); the per-position acceptance ``a`` from
    the result's counters: ``spec_decode_accepted_tokens / spec_decode_num_drafts = sum_{i=1..k} a^i`` (the model's
    one-rate acceptance, :func:`recommender.perf.speculative.acceptance_for`)."""
    counters = sorted(k for k, v in doc.items() if str(k).startswith("spec_decode_") and v not in (None, 0, 0.0, [], ""))
    counters += [k for k in _SPEC_HINTS if k in doc and _truthy(doc[k])]
    found = _lookup("speculative_config", layers)
    config = found[0] if found is not None and _truthy(found[0]) else None
    if config is None:
        return None if not counters else (
            f"speculative decoding ({counters[0]}) without its speculative config: calibrate cannot tell MTP from a "
            f"draft model; add --metadata speculative_config='{{\"method\": \"mtp\", \"num_speculative_tokens\": K}}'")
    try:
        spec = parse_speculative_config(config if isinstance(config, str) else json.dumps(config), arch)
    except (ConfigError, TypeError, ValueError) as e:
        return f"speculative decoding: {str(e).replace('--speculative-config', 'speculative_config')}"
    if spec is None:
        return None
    drafts, accepted = doc.get("spec_decode_num_drafts"), doc.get("spec_decode_accepted_tokens")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (drafts, accepted)) \
            or not drafts > 0 or not 0 < accepted <= drafts * spec.num_speculative_tokens:  # type: ignore[operator]
        return ("MTP run without usable spec_decode_num_drafts / spec_decode_accepted_tokens: its acceptance is unknown; "
                "save the result with a vLLM that reports them")
    per_draft = float(accepted) / float(drafts)  # type: ignore[arg-type]
    return SpecDecode(num_speculative_tokens=spec.num_speculative_tokens,
                      acceptance_rate=acceptance_for(spec.num_speculative_tokens, per_draft),
                      acceptance_source=f"{where}: spec_decode_accepted_tokens / num_drafts = {per_draft:.3g}")


def _layout(layers: Iterable[tuple[str, Mapping[str, Any]]], arch: ModelArch, gpu: str, tp: int, where: str,
            cat: Catalog) -> tuple[int, bool] | str:
    """(``--data-parallel-size``, ``--enable-expert-parallel``) of a run, from the metadata, the sidecar or the flags
    (1 and off where not stated; the flag has no experts to place on a dense model, so it is read as off there), or
    why vLLM would not run that layout (``perf.moe.check_layout``'s line)."""
    found = _lookup("dp", layers)
    dp = _int_field(found[0], "data_parallel_size", where) if found is not None else 1
    found = _lookup("ep", layers)
    ep = found is not None and _bool_field(found[0], "enable_expert_parallel", where) and arch.is_moe
    try:
        check_layout(arch, gpu, cat.gpu(gpu).interconnect.gpus_per_domain, tp=tp, dp=dp, ep=ep)
    except ConfigError as e:
        return str(e)
    return dp, ep


def _bench_measurements(doc: Mapping[str, Any], where: str, fname: str, side: Mapping[str, Any],
                        defaults: Mapping[str, Any], cat: Catalog) -> list[Measurement] | Skip:
    if not isinstance(doc, Mapping):
        raise CalibrationError(f"{where}: expected a JSON object (a `vllm bench serve --save-result` result)")
    layers = (("file", doc), ("sidecar", side), ("flags", defaults))
    hint = "add it with `vllm bench serve --metadata KEY=VALUE`, a sidecar YAML next to the file, or a flag"
    # model: explicit fields first, then the served model id and the tokenizer
    found = _lookup("model", layers)
    if found is not None:
        model = resolve_model(str(found[0]), cat)
        if model is None:
            raise CalibrationError(f"{where}: field 'model' ({found[1]}) = {found[0]!r} is not a catalog model; "
                                   f"valid: {', '.join(sorted(cat.models))}")
    else:
        names = [str(doc[k]) for k in ("model_id", "tokenizer_id") if doc.get(k)]
        model = next((m for m in (resolve_model(n, cat) for n in names) if m), None)
        if model is None:
            raise CalibrationError(f"{where}: missing field 'model' (model_id/tokenizer_id {names or 'absent'} "
                                   f"are not catalog models); {hint} (--model)")
    found = _lookup("gpu", layers)
    if found is None:
        raise CalibrationError(f"{where}: missing field 'gpu'; {hint} (--gpu)")
    gpu = resolve_gpu(str(found[0]), cat)
    if gpu is None:
        raise CalibrationError(f"{where}: field 'gpu' ({found[1]}) = {found[0]!r} is not a catalog GPU; "
                               f"valid: {', '.join(sorted(cat.gpus))}")
    found = _lookup("tp", layers)
    if found is None:
        raise CalibrationError(f"{where}: missing field 'tp'; {hint} (--tp)")
    tp = _int_field(found[0], "tp", where)
    arch = cat.model(model)
    why = unmodelled_run(doc)
    if why is not None:
        return Skip(fname, f"{where}: {why}")
    layout = _layout(layers, arch, gpu, tp, where, cat)
    if isinstance(layout, str):
        return Skip(fname, f"{where}: {layout}")
    dp, ep = layout
    spec = _speculation(doc, layers, arch, where)
    if isinstance(spec, str):
        return Skip(fname, f"{where}: {spec}")
    wd_raw = _lookup("weight_dtype", layers)
    wd = weight_dtype_of(None if wd_raw is None else str(wd_raw[0]), native_weight_dtype(arch))
    if wd is None:
        raise CalibrationError(f"{where}: field 'weight_dtype' = {wd_raw[0]!r} is not one of "  # type: ignore[index]
                               f"{', '.join(sorted(set(_WEIGHT_ALIASES.values())))}")
    kd_raw = _lookup("kv_dtype", layers)
    kd = kv_dtype_of(None if kd_raw is None else str(kd_raw[0]), "bf16")
    if kd is None:
        raise CalibrationError(f"{where}: field 'kv_dtype' = {kd_raw[0]!r} is not auto, bf16, fp16 or fp8")  # type: ignore[index]
    completed = _number(doc, "completed", where)
    if completed < 1:
        raise CalibrationError(f"{where}: field 'completed' is {completed:g}: no request finished, nothing to fit")
    prompt = _lookup("prompt_tokens", layers)
    output = _lookup("output_tokens", layers)
    isl = int(round(_number(doc, "total_input_tokens", where) / completed)) if prompt is None or prompt[1] != "file" \
        else _int_field(prompt[0], "prompt_tokens", where)
    osl = int(round(_number(doc, "total_output_tokens", where) / completed)) if output is None or output[1] != "file" \
        else _int_field(output[0], "output_tokens", where)
    for name, n in (("prompt_tokens", isl), ("output_tokens", osl)):
        if n > max_calibration_tokens():  # before any model is built: 1e12 tokens would never finish
            raise CalibrationError(f"{where}: field {name!r} = {n:,} tokens is above the {max_calibration_tokens():,}-token "
                                   f"limit (raise it with {MAX_CALIBRATION_TOKENS_ENV}=<tokens>)")
    if isl < 1 or osl < 1:
        raise CalibrationError(f"{where}: fields 'total_input_tokens'/'total_output_tokens' give {isl}/{osl} tokens per request")
    rate = _number(doc, "request_rate", where) if "request_rate" in doc else math.inf
    conc_v = doc.get("max_concurrency")
    if conc_v is not None and (isinstance(conc_v, bool) or not isinstance(conc_v, (int, float)) or not conc_v >= 1
                               or not math.isfinite(conc_v) or conc_v != int(conc_v)):
        raise CalibrationError(f"{where}: field 'max_concurrency' must be a positive integer or null, got {conc_v!r}")
    n_prompts = _int_field(doc.get("num_prompts") or int(completed), "num_prompts", where)
    if n_prompts > MAX_CALIBRATION_REQUESTS or completed > MAX_CALIBRATION_REQUESTS:
        raise CalibrationError(f"{where}: field 'num_prompts'/'completed' is above the {MAX_CALIBRATION_REQUESTS:,}-request "
                               f"limit")
    cap = int(conc_v) if conc_v is not None else n_prompts
    load = Load.closed(concurrency=cap, prompt_tokens=isl, output_tokens=osl)
    rate_per_s = rate if math.isfinite(rate) and rate > 0 else None
    eng = _lookup("engine", layers)
    engine = str(eng[0]) if eng else str(defaults.get("engine_default", "vllm"))
    lim = default_limits(cat.gpu(gpu))
    seqs = _lookup("max_num_seqs", layers)
    toks = _lookup("max_num_batched_tokens", layers)
    chunked = _lookup("chunked_prefill", layers)
    gmu = _lookup("gpu_memory_utilization", layers)
    limits = EngineLimits(max_num_seqs=_int_field(seqs[0], "max_num_seqs", where) if seqs else lim.max_num_seqs,
                          max_num_batched_tokens=_int_field(toks[0], "max_num_batched_tokens", where) if toks
                          else lim.max_num_batched_tokens,
                          chunked_prefill=str(chunked[0]).lower() not in ("false", "0", "no") if chunked else True)
    base: dict[str, Any] = dict(source=fname, file=where, engine=engine, model=model, gpu=gpu, tp=tp, dp=dp, ep=ep,
                spec_tokens=spec.num_speculative_tokens if spec else 0, acceptance_rate=spec.acceptance_rate if spec else 0.0,
                weight_dtype=wd, kv_dtype=kd,
                load=load, limits=limits, gpu_memory_utilization=_float_field(gmu[0], "gpu_memory_utilization", where) if gmu else 0.92, rate_per_s=rate_per_s,
                requests=int(completed))
    out = [Measurement(id=f"{fname}#output_throughput", quantity="output_tokens_per_s",
                       value=_number(doc, "output_throughput", where), raw_metric="output_throughput", **base)]
    for q, metric in (("ttft_s", "ttft"), ("tpot_s", "tpot")):
        # the mean, as the model predicts it: a closed loop's first wave puts the mean TTFT well above the median
        # (InferenceX: 1.2x at concurrency 4, 3.5x at 64), so a median fitted against a predicted mean is biased low
        key = next((k for k in (f"mean_{metric}_ms", f"median_{metric}_ms") if k in doc), None)
        if key is None:
            raise CalibrationError(f"{where}: missing field 'mean_{metric}_ms' (and 'median_{metric}_ms')")
        v = _number(doc, key, where) * 1e-3
        if v > 0 and not (q == "tpot_s" and osl < 2):
            out.append(Measurement(id=f"{fname}#{key}", quantity=q, value=v, raw_metric=key, **base))
    if out[0].value <= 0:
        raise CalibrationError(f"{where}: field 'output_throughput' must be positive, got {out[0].value:g}")
    return out


def read_bench_json(path: str | Path, defaults: Mapping[str, Any] | None = None,
                    catalog: Catalog | None = None) -> ReadResult:
    """Read one ``vllm bench serve --save-result`` file (a JSON object, or JSON lines with ``--append-result``)."""
    p = Path(path)
    cat = catalog or default_catalog()
    text = _read_results(p)
    try:
        docs = [load_json_text(text, str(p))]
    except json.JSONDecodeError as e:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        try:
            docs = [load_json_text(ln, str(p)) for ln in lines] if len(lines) > 1 else []
        except json.JSONDecodeError:
            docs = []
        except ValueError as e2:
            raise CalibrationError(str(e2)) from None
        if not docs:
            raise CalibrationError(f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:
        raise CalibrationError(str(e)) from None
    side = _sidecar(p)
    ms: list[Measurement] = []
    skips: list[Skip] = []
    for i, doc in enumerate(docs):
        where = str(p) if len(docs) == 1 else f"{p} (result {i + 1})"
        fname = p.name if len(docs) == 1 else f"{p.name}[{i + 1}]"
        got = _bench_measurements(doc, where, fname, side, defaults or {}, cat)
        if isinstance(got, Skip):
            skips.append(dataclasses.replace(got, file=str(p), unit="result"))
        else:
            ms.extend(got)
    return ReadResult(tuple(ms), tuple(skips), (str(p),))


def _content(m: Measurement) -> tuple[Any, ...]:
    """What a row measured, without where it was read from (its id, source and file)."""
    return (m.engine, m.model, m.gpu, m.tp, m.dp, m.ep, m.spec_tokens, m.acceptance_rate, m.weight_dtype, m.kv_dtype, m.load, m.quantity, m.value, m.limits,
            m.gpu_memory_utilization, m.cuda_graphs, m.rate_per_s, m.requests)


_RESULT_OF_FILE = re.compile(r" \(result \d+\)$")


def file_of(m: Measurement) -> str:
    """The results file ``m`` was read from, as given (a bench result's ``file`` names its result in an
    ``--append-result`` file: "runs.json (result 2)")."""
    return _RESULT_OF_FILE.sub("", m.file)


def is_csv_row(m: Measurement) -> bool:
    """Whether ``m`` is a row of a CSV (read_results reads ``.csv`` files as CSV, anything else as bench JSON)."""
    return Path(m.file).suffix.lower() == ".csv"


def measurement_skips(ms: Iterable[Measurement], reason: str | Callable[[Measurement], str]) -> list[Skip]:
    """Skips for measurements read and then left out (``reason``: one for all, or one per measurement): one per CSV
    row, one per `vllm bench serve` result (its figures together), so that reports count what the user can find in
    the files."""
    why: Callable[[Measurement], str] = (lambda m: reason) if isinstance(reason, str) else reason
    out: list[Skip] = []
    seen: set[str] = set()
    for m in ms:
        if is_csv_row(m):
            out.append(Skip(m.id, why(m), file=file_of(m), unit="row"))
        elif m.file not in seen:
            seen.add(m.file)
            out.append(Skip(m.source, why(m), file=file_of(m), unit="result"))
    return out


def drop_repeats(read: ReadResult) -> ReadResult:
    """Skip a result (a file, or one result of an ``--append-result`` file) whose rows are exactly an earlier one's:
    the same run under two names would be held out against a fit that saw its copy."""
    groups: dict[str, list[Measurement]] = {}
    for m in read.measurements:
        groups.setdefault(m.file, []).append(m)
    seen: dict[tuple[Any, ...], str] = {}
    keep: list[Measurement] = []
    skips: list[Skip] = []
    for where, rows in groups.items():
        key = tuple(sorted((_content(m) for m in rows), key=repr))
        if key in seen:
            why = f"{where}: the same results as {seen[key]} (a copy?): counted once"
            skips += measurement_skips(rows, why)
            continue
        seen[key] = where
        keep += rows
    return ReadResult(tuple(keep), read.skipped + tuple(skips), read.files)


def read_results(paths: Iterable[str | Path], defaults: Mapping[str, Any] | None = None,
                 catalog: Catalog | None = None) -> ReadResult:
    """Read every file: ``.csv`` in the published format, anything else as bench-serve JSON."""
    total = ReadResult()
    seen: set[str] = set()
    for path in paths:
        p = Path(path)
        key = os.path.realpath(p)
        if key in seen:  # the same file named twice counts once
            continue
        seen.add(key)
        if p.suffix.lower() == ".csv":
            total = total + read_published_csv(p, catalog)
        elif p.suffix.lower() in (".yaml", ".yml"):
            raise CalibrationError(f"{p}: a YAML file is a sidecar, not a result; pass the JSON file it describes")
        else:
            total = total + read_bench_json(p, defaults, catalog)
    total = drop_repeats(total)
    if not total.measurements:
        reasons = sorted({s.reason for s in total.skipped})[:3]
        raise CalibrationError("no usable measurements in " + ", ".join(str(p) for p in total.files)
                               + (f" (skipped: {'; '.join(reasons)})" if reasons else ""))
    return total


__all__ = ["ReadResult", "file_of", "is_csv_row", "measurement_skips", "read_published_csv", "read_bench_json", "read_results", "unmodelled_run", "drop_repeats",
           "weight_dtype_of", "kv_dtype_of", "engine_of", "FIELD_KEYS"]
