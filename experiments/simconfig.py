"""A ``SimConfig`` dict from flag values and/or a TOML/JSON experiment file.

The simulation flags (``experiments.cli.flags.add_sim_flags``) mirror vLLM's engine arguments
(``--max-num-batched-tokens``, ``--enable-prefix-caching``, ``--tensor-parallel-size`` …) and
``vllm bench serve``'s workload arguments (``--request-rate``, ``--dataset-name`` …). Every flag
maps to one field of ``SimConfig`` (``FLAG_FIELDS``); a flag the user gives overrides the
experiment file, which overrides the defaults. The same table lets experiment files
(``experiments.sweep.expfile``) accept any of these keys. Nothing here parses a command line,
so the sweeps and the validation use it as the CLI does.
"""

from __future__ import annotations

import argparse
import json
import math
import tomllib
from pathlib import Path
from typing import Any

from engine.core.config import ConfigError
from engine.core.errors import UserError

#: argparse dest -> (section or None for top level, SimConfig field)
FLAG_FIELDS: dict[str, tuple[str | None, str]] = {
    "model": (None, "model"),
    "gpu": (None, "gpu"),
    "tensor_parallel_size": (None, "tensor_parallel_size"),
    "data_parallel_size": (None, "data_parallel_size"),
    "enable_expert_parallel": (None, "enable_expert_parallel"),
    "all2all_backend": (None, "all2all_backend"),
    "pipeline_parallel_size": (None, "pipeline_parallel_size"),
    "gpus_per_node": (None, "gpus_per_node"),
    "network": (None, "network"),
    "router": (None, "router"),
    "router_load_cap": (None, "router_load_cap"),
    "gpu_memory_utilization": (None, "gpu_memory_utilization"),
    "num_gpu_blocks_override": (None, "num_gpu_blocks"),
    "max_model_len": (None, "max_model_len"),
    "cost_model": (None, "cost_model"),
    "dtype": (None, "dtype"),
    "quantization": (None, "quantization"),
    "kv_cache_dtype": (None, "kv_cache_dtype"),
    "enforce_eager": ("cuda_graphs", "enforce_eager"),
    "max_cudagraph_capture_size": ("cuda_graphs", "max_cudagraph_capture_size"),
    "cudagraph_capture_sizes": ("cuda_graphs", "cudagraph_capture_sizes"),
    "seed": ("workload", "seed"),
    "fast_path": (None, "fast_path"),
    "max_num_batched_tokens": ("engine", "max_num_batched_tokens"),
    "max_num_seqs": ("engine", "max_num_seqs"),
    "enable_chunked_prefill": ("engine", "enable_chunked_prefill"),
    "long_prefill_token_threshold": ("engine", "long_prefill_token_threshold"),
    "scheduling_policy": ("engine", "policy"),
    "policy_option": ("engine", "policy_options"),
    "scheduler_reserve_full_isl": ("engine", "scheduler_reserve_full_isl"),
    "async_scheduling": ("engine", "async_scheduling"),
    "block_size": ("engine", "block_size"),
    "enable_prefix_caching": ("engine", "enable_prefix_caching"),
    "api_server_count": ("frontend", "num_api_servers"),
    "dataset_name": ("workload", "dataset_name"),
    "dataset_path": ("workload", "dataset_path"),
    "num_prompts": ("workload", "num_prompts"),
    "request_rate": ("workload", "request_rate"),
    "burstiness": ("workload", "burstiness"),
    "max_concurrency": ("workload", "max_concurrency"),
    "random_input_len": ("workload", "random_input_len"),
    "random_output_len": ("workload", "random_output_len"),
    "random_range_ratio": ("workload", "random_range_ratio"),
    "random_prefix_len": ("workload", "random_prefix_len"),
    "prefix_repetition_prefix_len": ("workload", "prefix_repetition_prefix_len"),
    "prefix_repetition_suffix_len": ("workload", "prefix_repetition_suffix_len"),
    "prefix_repetition_num_prefixes": ("workload", "prefix_repetition_num_prefixes"),
    "prefix_repetition_output_len": ("workload", "prefix_repetition_output_len"),
    "trace_time_scale": ("workload", "trace_time_scale"),
    "slo_classes": ("workload", "slo_classes"),
    "slo_class_mix": ("workload", "slo_class_mix"),
    "tenant_mix": ("workload", "tenant_mix"),
    "tokenizer": ("workload", "tokenizer"),
    "sharegpt_output_len": ("workload", "sharegpt_output_len"),
    "ramp_up_strategy": ("workload", "ramp_up_strategy"),
    "ramp_up_start_rps": ("workload", "ramp_up_start_rps"),
    "ramp_up_end_rps": ("workload", "ramp_up_end_rps"),
}

#: The embedded default run of ``twinserve simulate`` with no arguments.
DEFAULT_DATASET = {"dataset_name": "trace", "dataset_path": "azure-conv", "num_prompts": 1000}


def load_experiment_file(path: str) -> dict[str, Any]:
    """A TOML or JSON file holding a SimConfig dict (sections engine, frontend, workload…)."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text.decode())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid {'JSON' if p.suffix == '.json' else 'TOML'}: "
                        f"{exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a table/object at the top level")
    return data


def workload_dict_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ``workload`` section the workload flags describe (with the embedded default); its
    class tables as tuples, as ``WorkloadConfig`` holds them."""
    work = config_dict_from_args(args, {}, sections=("workload",))["workload"]
    for key in ("priority_mix", "tenant_mix", "slo_classes", "slo_class_mix"):
        if isinstance(work.get(key), list):
            work[key] = tuple(tuple(p) for p in work[key])
    return dict(work)


def _implied_datasets(work: dict[str, Any]) -> list[str]:
    """Datasets whose own keys the workload sets: a file implies a trace, random_* keys the
    random dataset, prefix_repetition_* keys prefix_repetition, a ``.json`` file the sharegpt
    dataset (so such flags are never
    silently ignored in favour of the default trace)."""
    implied = []
    if "dataset_path" in work:
        path = str(work["dataset_path"])
        implied.append("sharegpt" if path.endswith(".json") else "trace")
    if any(k.startswith("random_") for k in work):
        implied.append("random")
    if any(k.startswith("prefix_repetition_") for k in work):
        implied.append("prefix_repetition")
    return implied


def config_dict_from_args(
    args: argparse.Namespace, base: dict[str, Any], sections: tuple[str | None, ...] | None = None
) -> dict[str, Any]:
    """Overlay the flags the user gave on ``base`` (a SimConfig dict). With an empty ``base``
    nothing of ``sim`` is imported (the real world builds its workload section this way)."""
    if base:
        from sim.config import require_section_tables

        require_section_tables(base)
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for dest, (section, name) in FLAG_FIELDS.items():
        if sections is not None and section not in sections:
            continue
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest == "policy_option":  # [(key, value), ...] from the flag
            from experiments.cli.flags import policy_options_from_flags

            value = policy_options_from_flags(value)
        if section is None:
            out[name] = value
        else:
            out.setdefault(section, {})[name] = value
    pp = out.get("pipeline_parallel_size", 1)
    if isinstance(pp, int) and pp > 1 and out.get("engine", {}).get("async_scheduling") is True:
        raise ConfigError(
            "async scheduling is not supported with pipeline parallelism (vLLM 0.33's V1 "
            "model runner refuses it too): drop --async-scheduling / async_scheduling = true"
        )
    work = out.setdefault("workload", {})
    if "dataset_name" not in work:
        implied = _implied_datasets(work)
        if len(implied) > 1:
            raise ConfigError(
                f"the workload sets keys of several datasets ({', '.join(implied)}); "
                "choose one with --dataset-name / dataset_name"
            )
        if implied:
            work["dataset_name"] = implied[0]
        else:
            for key, value in DEFAULT_DATASET.items():
                work.setdefault(key, value)
    if work.get("dataset_name") == "trace" and "request_rate" in work:
        rate = work["request_rate"]
        work["trace_rate_given"] = not (isinstance(rate, float) and math.isnan(rate))
    return out
