"""A simulation's complete, frozen configuration — and how its KV capacity follows from it.

``SimConfig`` holds everything a run depends on (model, GPU layout, engine knobs, front-end and
output-path costs, workload, seed), so a run is a pure function of it. It round-trips through
plain dicts (``to_dict``/``from_dict``) for ``config.json``, TOML/JSON experiment files and sweep
caching; unknown keys are rejected with the list of valid ones.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from engine.core.config import (
    BudgetDefaults,
    ConfigError,
    EngineConfig,
    EngineKnobs,
    check_field_types,
    config_from_dict,
)
from engine.core.errors import UserError
from engine.core.parallel import ParallelConfig, pp_layer_partition
from sim.cost.cuda_graphs import CudaGraphConfig
from sim.cost.host import HostCosts
from sim.cost.roofline import RooflineParams
from sim.hardware import GPUSpec, get_gpu
from sim.model_catalog import get_model
from sim.models import ModelSpec
from workload.config import WorkloadConfig

#: Upper bound of any one front-end cost or latency (one day): larger values are typos, and
#: would overflow the simulated clock.
MAX_COST_S = 86400.0
#: Most simulated engines behind one front end, and most KV blocks per engine (each engine
#: keeps a few lists of num_gpu_blocks entries): beyond these a run exhausts memory.
MAX_DATA_PARALLEL = 1024
MAX_API_SERVERS = 100_000
MAX_GPU_BLOCKS = 100_000_000
#: Cost models by name (besides "fitted:PATH"); "auto" = "vllm" where the GPU has tables.
COST_MODELS = ("auto", "vllm", "roofline")
#: vLLM's --dtype values the simulator prices (16-bit; the kernel tables are bf16).
DTYPES = ("auto", "bfloat16", "float16", "half")
QUANTIZATIONS: tuple[str | None, ...] = (None, "fp8", "fp8_per_tensor")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
#: vLLM's --all2all-backend values the simulator prices for expert parallelism: its default
#: (all-gather the DP ranks' tokens, reduce-scatter the expert outputs) and a true all-to-all
#: dispatch/combine (DeepEP, pplx, FlashInfer's, priced as NCCL all-to-all).
ALL2ALL_BACKENDS = ("allgather_reducescatter", "alltoall")


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """Costs of the request path outside the engine core (seconds; documented defaults).

    Defaults are estimates for a vLLM OpenAI server on a modern server CPU: request validation
    and chat templating ≈ 0.3 ms, fast (Rust) tokenization ≈ 1 µs per prompt token,
    detokenization ≈ 2 µs per streamed token, ZeroMQ + msgpack IPC ≈ 50 µs per message, and
    the engine core's own scheduling CPU ≈ 9 µs per scheduled request (of the order of vLLM
    0.33.0's scheduler; see docs/simulator.md for what was measured).

    ``first_output_overhead_s`` is what a request's first output costs the output path beyond
    a later one's (its response's first chunk); 0 by default, ``twinserve validate`` measures
    it on the served path.

    ``idle_wakeup_s`` is extra time of the first model step after the engine loop had nothing
    to do (caches gone cold, clocks lowered while it slept); an idle period shorter than
    ``idle_wakeup_ramp_s`` pays it pro rata (0: any idle period pays all of it). Both are 0 by
    default; ``twinserve profile`` measures them for the machine at hand.
    """

    num_api_servers: int = 1  # front-end processes (vLLM --api-server-count)
    request_overhead_s: float = 3e-4  # validation + chat template, per request
    tokenize_s_per_token: float = 1e-6  # per prompt token
    ipc_latency_s: float = 5e-5  # front end <-> engine core, per message
    detokenize_s_per_token: float = 2e-6  # output processor, per generated token
    output_batch_overhead_s: float = 3e-5  # output processor, per engine step's outputs
    first_output_overhead_s: float = 0.0  # output processor, per request's first output
    network_latency_s: float = 0.0  # client <-> server, one way
    schedule_overhead_s: float = 5e-5  # engine core CPU per step: schedule() base cost
    schedule_s_per_request: float = 9e-6  # ... plus this per scheduled request
    update_overhead_s: float = 2e-5  # engine core CPU per step: update_from_output() base
    idle_wakeup_s: float = 0.0  # extra time of the first step after the engine loop idled
    idle_wakeup_ramp_s: float = 0.0  # idle time from which the whole wake-up cost is paid

    def wakeup_s(self, idle_s: float) -> float:
        """Extra time of the first step after an idle period of ``idle_s`` seconds."""
        if idle_s <= 0.0 or self.idle_wakeup_s <= 0.0:
            return 0.0
        ramp = self.idle_wakeup_ramp_s
        if ramp <= 0.0 or idle_s >= ramp:
            return self.idle_wakeup_s
        return self.idle_wakeup_s * idle_s / ramp

    def __post_init__(self) -> None:
        if not 1 <= self.num_api_servers <= MAX_API_SERVERS:
            raise ConfigError(
                f"num_api_servers must be in [1, {MAX_API_SERVERS:,}], got {self.num_api_servers}"
            )
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "num_api_servers" and not 0 <= value <= MAX_COST_S:
                raise ConfigError(
                    f"{f.name} must be a number in [0, {MAX_COST_S:g}] s, got {value}"
                )


def server_defaults(gpu: GPUSpec) -> BudgetDefaults:
    """vLLM 0.33.0's online-serving (max_num_batched_tokens, max_num_seqs) for a GPU
    (SCHEDULER_SPEC.md §1): >=160 GiB: 16384/1024; >=70 GiB except A100: 8192/1024; else
    2048/256."""
    if gpu.usable_memory_gib >= 160:
        return BudgetDefaults(16384, 1024)
    if gpu.usable_memory_gib >= 70 and not gpu.name.startswith("a100"):
        return BudgetDefaults(8192, 1024)
    return BudgetDefaults(2048, 256)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated run: what is served, on what, with which knobs, under which load."""

    model: str = "meta-llama/Llama-3.1-8B"
    gpu: str = "h100-sxm"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.92
    num_gpu_blocks: int | None = None  # override the memory-derived block count
    max_model_len: int | None = None  # None = the model's context length
    engine: EngineKnobs = field(default_factory=EngineKnobs)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    roofline: RooflineParams = field(default_factory=RooflineParams)
    host_costs: HostCosts = field(default_factory=HostCosts)
    cuda_graphs: CudaGraphConfig = field(default_factory=CudaGraphConfig)
    cost_model: str = "auto"  # "auto", "vllm", "roofline" or "fitted:PATH"
    dtype: str = "auto"  # vLLM --dtype: 16-bit activations and unquantized weights
    quantization: str | None = None  # vLLM --quantization: None or fp8 (W8A8)
    kv_cache_dtype: str = "auto"  # vLLM --kv-cache-dtype: auto (= the model dtype) or fp8
    data_parallel_size: int = 1  # engine replicas behind the shared API servers
    pipeline_parallel_size: int = 1  # stages each replica's layers are split over
    gpus_per_node: int = 8  # GPUs of one node: TP stays inside, PP/DP hops may cross nodes
    network: str = "infiniband-ndr"  # the fabric between nodes (sim/network.py)
    router: str = "vllm"  # how requests pick a replica (engine/core/routing.py)
    router_load_cap: int = 8  # prefix_aware: max extra in-flight requests for a better hit
    fast_path: bool = True  # exact bulk application of identical decode steps
    enable_expert_parallel: bool = False  # vLLM's flag: MoE experts whole over the TP × DP ranks
    all2all_backend: str = "allgather_reducescatter"  # EP dispatch/combine (vLLM's default)

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(
                f"max_model_len must be >= 2 tokens (a prompt token and an output), "
                f"got {self.max_model_len}"
            )
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ConfigError(
                f"num_gpu_blocks must be >= 2 (block 0 is the reserved null block), "
                f"got {self.num_gpu_blocks}"
            )
        if self.num_gpu_blocks is not None and self.num_gpu_blocks > MAX_GPU_BLOCKS:
            raise ConfigError(
                f"num_gpu_blocks must be <= {MAX_GPU_BLOCKS:,}, got {self.num_gpu_blocks}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if not 1 <= self.data_parallel_size <= MAX_DATA_PARALLEL:
            raise ConfigError(
                f"data_parallel_size must be in [1, {MAX_DATA_PARALLEL}] (one simulated engine "
                f"each), got {self.data_parallel_size}"
            )
        from sim.cluster import ROUTERS  # the shared routers and the simulator's own

        if self.router not in ROUTERS:
            raise ConfigError(f"unknown router {self.router!r}; valid: {', '.join(ROUTERS)}")
        if self.tensor_parallel_size < 1:
            raise ConfigError(
                f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}"
            )
        if self.router_load_cap < 0:
            raise ConfigError(f"router_load_cap must be >= 0, got {self.router_load_cap}")
        self._check_policy()
        self._check_pipeline()
        if not self.uses_catalog_labels_only:
            get_model(self.model)
            get_gpu(self.gpu)
        if not (self.cost_model in COST_MODELS or self.cost_model.startswith("fitted:")):
            raise ConfigError(
                f"cost_model must be one of {', '.join(COST_MODELS)} or 'fitted:PATH', "
                f"got {self.cost_model!r}"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(
                f"dtype must be one of {', '.join(DTYPES)} (the simulator prices 16-bit "
                f"models), got {self.dtype!r}"
            )
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(
                f"quantization must be one of {', '.join(str(q) for q in QUANTIZATIONS)}, "
                f"got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.all2all_backend not in ALL2ALL_BACKENDS:
            raise ConfigError(
                f"all2all_backend must be one of {', '.join(ALL2ALL_BACKENDS)}, "
                f"got {self.all2all_backend!r}"
            )
        if not self.uses_catalog_labels_only:
            self._check_model_on_gpu()
        if self.resolved_cost_model == "vllm" and not self.uses_catalog_labels_only:
            gpu = get_gpu(self.gpu)
            if gpu.kernel_tables is None:
                raise ConfigError(
                    f"cost_model 'vllm' needs measured kernel tables, which {gpu.name} has "
                    "none of; use 'roofline'"
                )

    def _check_model_on_gpu(self) -> None:
        """Expert parallelism needs experts; fp8 weights need fp8 tensor cores."""
        spec = get_model(self.model)
        if self.enable_expert_parallel and not spec.is_moe:
            raise ConfigError(
                f"--enable-expert-parallel needs a mixture-of-experts model; {spec.name} "
                f"({spec.architecture}) is dense"
            )
        gpu = get_gpu(self.gpu)
        if gpu.fp8_tflops is not None:
            return
        if self.fp8_weights:
            raise ConfigError(
                f"--quantization {self.quantization} needs fp8 tensor cores, which "
                f"{gpu.display_name} lacks (vLLM would fall back to weight-only Marlin "
                "kernels, which the simulator does not price)"
            )
        if spec.linear_weight_bytes == 1:
            raise ConfigError(
                f"{spec.name} is an fp8 checkpoint, which needs fp8 tensor cores; "
                f"{gpu.display_name} lacks them (weight-only Marlin kernels are not priced)"
            )

    @property
    def expert_parallel_size(self) -> int:
        """GPUs the experts are spread over whole: vLLM's EP group is the TP × DP world (1:
        tensor-parallel experts)."""
        if not self.enable_expert_parallel:
            return 1
        return self.tensor_parallel_size * self.data_parallel_size

    @property
    def moe_shard_size(self) -> int:
        """GPUs a MoE model's expert weights are sharded over: vLLM shards MoE layers over the
        whole TP × DP world, whole experts (EP) or slices of each (TP); 1 for dense models."""
        if not self.model_spec.is_moe:
            return 1
        return self.tensor_parallel_size * self.data_parallel_size

    @property
    def weight_dtype(self) -> str:
        """The decoder's linear GEMMs: "fp8" (``--quantization fp8`` or an fp8 checkpoint) or
        "bfloat16"."""
        return "fp8" if self.fp8_weights or self.model_spec.linear_bytes == 1 else "bfloat16"

    def _check_policy(self) -> None:
        """The scheduling policy's class can be imported and is one, and a policy that needs
        SLOs gets a workload whose requests carry them (its options are checked when it is
        built, with the engine)."""
        from engine.core.policy import needs_slos_message, policy_class

        cls = policy_class(self.engine.policy)
        if getattr(cls, "needs_slos", False) is True and not self.workload.slo_classes:
            raise ConfigError(needs_slos_message(self.engine.policy))

    def _check_pipeline(self) -> None:
        from sim.network import get_network

        ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            data_parallel_size=self.data_parallel_size,
        )
        if not 1 <= self.gpus_per_node <= 1024:
            raise ConfigError(f"gpus_per_node must be in [1, 1024], got {self.gpus_per_node}")
        get_network(self.network)
        if self.pipeline_parallel_size > 1 and self.cost_model.startswith("fitted:"):
            raise ConfigError(
                "a fitted cost model prices whole steps of the layout it was profiled on; "
                "pipeline_parallel_size > 1 needs cost_model vllm, roofline or auto"
            )
        if not self.uses_catalog_labels_only:
            m = get_model(self.model)
            self.parallel.check_model(m.num_heads, m.num_kv_heads, m.num_layers, m.name)

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            data_parallel_size=self.data_parallel_size,
        )

    @property
    def fp8_weights(self) -> bool:
        """``--quantization fp8``: fp8 linear weights and W8A8 GEMMs."""
        return self.quantization in ("fp8", "fp8_per_tensor")

    @property
    def fp8_kv_cache(self) -> bool:
        return self.kv_cache_dtype.startswith("fp8")

    @property
    def resolved_cost_model(self) -> str:
        """The cost model a run uses: "auto" is the vLLM step model where the GPU has measured
        kernel tables, the roofline elsewhere."""
        if self.cost_model != "auto":
            return self.cost_model
        try:
            gpu = get_gpu(self.gpu)
        except UserError:
            return "roofline"
        return "vllm" if gpu.kernel_tables is not None else "roofline"

    @property
    def uses_catalog_labels_only(self) -> bool:
        """A fitted cost model with the KV blocks and max_model_len given needs nothing from
        the catalogs: ``model`` and ``gpu`` are then free labels (e.g. a checkpoint directory
        and "cpu" when validating against a measured run)."""
        return (
            self.cost_model.startswith("fitted:")
            and self.num_gpu_blocks is not None
            and self.max_model_len is not None
        )

    @property
    def seed(self) -> int:
        """The run's seed: everything random in a simulation comes from the workload."""
        return self.workload.seed

    @property
    def model_spec(self) -> ModelSpec:
        """The catalog model with this run's weight and KV-cache dtypes."""
        spec = get_model(self.model)
        if self.fp8_weights or self.fp8_kv_cache:
            return spec.with_dtypes(fp8_weights=self.fp8_weights, fp8_kv_cache=self.fp8_kv_cache)
        return spec

    @property
    def gpu_spec(self) -> GPUSpec:
        return get_gpu(self.gpu)

    # -- dict round trip ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            is_record = dataclasses.is_dataclass(value) and not isinstance(value, type)
            out[f.name] = dataclasses.asdict(value) if is_record else value
        w = out["workload"]
        w["request_rate"] = _encode_float(w["request_rate"])
        for name in ("priority_mix", "tenant_mix", "slo_classes", "slo_class_mix"):
            w[name] = [list(p) for p in w[name]]
        e = out["engine"]
        e["policy_options"] = dict(e["policy_options"])
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SimConfig:
        values = dict(values)
        require_section_tables(values)
        kwargs: dict[str, Any] = {}
        if "seed" in values:  # accepted at the top level too: it is the workload's seed
            seed = values.pop("seed")
            work = dict(values.get("workload") or {})
            if "seed" in work and work["seed"] != seed:
                raise ConfigError(f"seed given twice: {seed} (top level) and {work['seed']}")
            work["seed"] = seed
            values["workload"] = work
        for name, sub in SECTIONS.items():
            if name in values:
                raw = dict(values.pop(name))
                if name == "workload":
                    if "request_rate" in raw:
                        raw["request_rate"] = _decode_float(raw["request_rate"])
                    for key in ("priority_mix", "tenant_mix", "slo_classes", "slo_class_mix"):
                        mix = raw.get(key)
                        if isinstance(mix, list | tuple) and all(
                            isinstance(p, list | tuple) for p in mix
                        ):
                            raw[key] = tuple(tuple(p) for p in mix)
                kwargs[name] = config_from_dict(sub, raw, where=f"[{name}]")
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(valid))
        if unknown:
            raise ConfigError(
                f"unknown key(s) {', '.join(unknown)}; valid top-level keys: {', '.join(valid)}"
            )
        check_field_types(cls, values)
        kwargs.update(values)
        return cls(**kwargs)


#: The config dataclass of each section of a ``SimConfig`` dict.
SECTIONS: dict[str, type[Any]] = {
    "engine": EngineKnobs,
    "frontend": FrontendConfig,
    "workload": WorkloadConfig,
    "roofline": RooflineParams,
    "host_costs": HostCosts,
    "cuda_graphs": CudaGraphConfig,
}


def require_section_tables(values: dict[str, Any]) -> None:
    """Each section given in a ``SimConfig`` dict must be a table/object."""
    for name in SECTIONS:
        if name in values and not isinstance(values[name], dict):
            raise ConfigError(f"section {name!r} must be a table/object, got {values[name]!r}")


def _encode_float(x: float) -> float | str:
    return "inf" if math.isinf(x) else x


def _decode_float(x: object) -> object:
    """``"inf"``/``"infinity"`` (JSON has no infinity) become ``math.inf``; anything else is
    returned as it is, for the type check to accept or name."""
    if isinstance(x, str) and x.strip().lower() in ("inf", "infinity"):
        return math.inf
    return x


# -- KV capacity ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KVCapacity:
    """How vLLM would size the KV cache for this layout (per GPU; TP splits KV heads)."""

    total_bytes: float  # device memory as the driver reports it
    budget_bytes: float  # total × gpu_memory_utilization
    weight_bytes: float  # this GPU's share of the weights
    activation_bytes: float  # peak non-KV memory of the profiling forward (+ runtime overhead)
    kv_bytes: float  # what is left for the KV cache
    bytes_per_block: float
    num_gpu_blocks: int  # incl. the null block


#: CUDA context, NCCL buffers, allocator fragmentation and CUDA graphs: not in the profile.
RUNTIME_OVERHEAD_BYTES = 1.5 * 2**30


def kv_capacity(cfg: SimConfig) -> KVCapacity:
    """Blocks = (memory × utilization − weights per GPU − activation peak) / bytes per block.

    Weights per GPU: the linear layers split over TP, a MoE model's experts over the whole
    TP × DP world as vLLM shards them (``ModelSpec.weight_bytes_per_gpu``). A block holds
    ``block_size`` tokens of this GPU's full-attention layers: its KV heads (replicated once
    TP exceeds them), or MLA's latent (replicated on every TP rank). Sliding-window layers
    hold at most the window per request and are not counted per token (docs/cost_model.md).

    The activation peak is that of vLLM's profiling forward at ``max_num_batched_tokens``
    tokens (``activation_bytes_per_token``) plus the logits of ``max_num_seqs`` sampled rows
    in fp32, per TP rank.

    With pipeline stages each GPU holds its stage's layers (and the embedding on the first,
    the LM head on the last) and the KV of its layers only; every stage gets the block count
    of the most constrained one (vLLM takes the smallest over its workers).
    """
    if cfg.pipeline_parallel_size > 1:
        return _pipeline_kv_capacity(cfg)
    m, g, tp = cfg.model_spec, cfg.gpu_spec, cfg.tensor_parallel_size
    budgets = cfg.engine.budgets(budget_defaults(cfg))
    t, max_num_seqs = budgets.max_num_batched_tokens, budgets.max_num_seqs
    logits = min(max_num_seqs, t) * m.vocab_size / tp * 4
    per_token = activation_bytes_per_token(m, tp, cfg.moe_shard_size, cfg.enable_expert_parallel)
    activation = t * per_token + logits + RUNTIME_OVERHEAD_BYTES
    budget = g.memory_bytes * cfg.gpu_memory_utilization
    weights = m.weight_bytes_per_gpu(tp, cfg.moe_shard_size)
    kv = budget - weights - activation
    per_block = cfg.engine.block_size * m.kv_bytes_per_token_per_gpu(tp)
    blocks = int(kv // per_block) if kv > 0 else 0
    return KVCapacity(g.memory_bytes, budget, weights, activation, kv, per_block, blocks)


def activation_bytes_per_token(m: ModelSpec, tp: int, moe_shards: int = 1,
                               expert_parallel: bool = False) -> float:
    """Peak activation bytes per scheduled token of one forward (bf16): the widest MLP
    intermediate (gate+up of a dense MLP; the fused-MoE workspace of top-k rows of
    ``max(2·width, hidden) + width``), the attention projections' outputs and residual
    stream copies, per TP rank."""
    a = 2
    dense = 2 * (m.dense_intermediate_size if m.is_moe else m.intermediate_size) / tp
    widest = dense
    if m.is_moe:
        width = m.intermediate_size / (1 if expert_parallel else max(moe_shards, tp))
        widest = max(dense, m.num_experts_per_token * (max(2 * width, m.hidden_size) + width))
    if m.is_mla:
        attn = m.num_heads * (m.q_head_dim + m.qk_nope_head_dim + m.v_head_dim) / tp
    else:
        attn = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim / tp
    return (widest + attn + 4 * m.hidden_size) * a


def _pipeline_kv_capacity(cfg: SimConfig) -> KVCapacity:
    """``kv_capacity`` per stage; the stage that holds the fewest blocks decides."""
    m = cfg.model_spec
    parts = pp_layer_partition(m.num_layers, cfg.pipeline_parallel_size)
    layer_bytes = m.num_layers * (m.attn_params + m.mlp_params) * m.linear_bytes
    embed_bytes = m.embedding_params * m.dtype_bytes
    head_bytes = 0 if m.tie_word_embeddings else embed_bytes
    whole = kv_capacity(dataclasses.replace(cfg, pipeline_parallel_size=1))
    tp = cfg.tensor_parallel_size
    best: KVCapacity | None = None
    for s, n in enumerate(parts):
        share = n / m.num_layers
        weights = (layer_bytes * share + (embed_bytes if s == 0 else 0)
                   + (head_bytes if s == len(parts) - 1 else 0)) / tp
        per_block = whole.bytes_per_block * share
        kv = whole.budget_bytes - weights - whole.activation_bytes
        blocks = int(kv // per_block) if kv > 0 else 0
        stage = KVCapacity(whole.total_bytes, whole.budget_bytes, weights,
                           whole.activation_bytes, kv, per_block, blocks)
        if best is None or stage.num_gpu_blocks < best.num_gpu_blocks:
            best = stage
    assert best is not None
    return best


def budget_defaults(cfg: SimConfig) -> BudgetDefaults:
    """The budgets an unset knob takes: vLLM's online defaults for the GPU. Not looked up when
    the knobs set both (a fitted cost model's run may name a device the catalog lacks)."""
    e = cfg.engine
    if e.max_num_batched_tokens is not None and e.max_num_seqs is not None:
        return BudgetDefaults(e.max_num_batched_tokens, e.max_num_seqs)
    return server_defaults(cfg.gpu_spec)


def resolve_engine_config(cfg: SimConfig) -> EngineConfig:
    """The engine config the simulated engine runs with: KV blocks from memory unless given,
    vLLM's per-GPU budget defaults, ``max_model_len`` from the model (shrunk to what the KV
    cache holds, as vLLM's auto-fit does, unless the user fixed it).

    Raises ``ConfigError`` when the model does not fit or one max-length request cannot.
    """
    e = cfg.engine
    if not cfg.uses_catalog_labels_only:
        m = cfg.model_spec
        if cfg.max_model_len is not None and cfg.max_model_len > m.max_model_len:
            raise ConfigError(
                f"max_model_len {cfg.max_model_len} exceeds {m.name}'s context length "
                f"{m.max_model_len}"
            )
    max_model_len = cfg.max_model_len or cfg.model_spec.max_model_len
    if cfg.num_gpu_blocks is not None:
        num_blocks = cfg.num_gpu_blocks
    else:
        cap = kv_capacity(cfg)
        if cap.num_gpu_blocks < 2 and cap.kv_bytes > 0:
            raise ConfigError(
                f"the {cap.kv_bytes / 2**30:.2f} GiB left for the KV cache per GPU hold "
                f"{cap.num_gpu_blocks} block(s) of {e.block_size} tokens "
                f"({cap.bytes_per_block / 2**20:.1f} MiB each); at least 2 are needed "
                "(block 0 is the reserved null block): lower block_size"
            )
        if cap.num_gpu_blocks < 2:
            raise ConfigError(
                f"{m.name} does not fit on {cfg.tensor_parallel_size} x {cfg.gpu}: weights "
                f"{cap.weight_bytes / 2**30:.1f} GiB + activations "
                f"{cap.activation_bytes / 2**30:.1f} GiB per GPU exceed "
                f"{cap.budget_bytes / 2**30:.1f} GiB (gpu_memory_utilization "
                f"{cfg.gpu_memory_utilization}); raise tensor_parallel_size or "
                "gpu_memory_utilization, or choose a larger GPU"
            )
        num_blocks = cap.num_gpu_blocks
    usable_tokens = (num_blocks - 1) * e.block_size
    if usable_tokens < max_model_len:
        if cfg.max_model_len is not None:
            raise ConfigError(
                f"one request of max_model_len {max_model_len} tokens needs "
                f"{-(-max_model_len // e.block_size)} KV blocks but only "
                f"{num_blocks - 1} fit; lower max_model_len, or give more KV memory "
                "(num_gpu_blocks, gpu_memory_utilization, tensor_parallel_size)"
            )
        max_model_len = usable_tokens  # as vLLM's auto-fit of max_model_len would
    if max_model_len < 2:
        raise ConfigError(f"the KV cache holds only {usable_tokens} tokens: no request fits")
    if cfg.pipeline_parallel_size > 1:
        # vLLM 0.33's V1 model runner turns async scheduling off under PP (one batch in flight
        # per stage instead)
        e = dataclasses.replace(e, async_scheduling=False)
    resolved = e.resolve(
        max_model_len=max_model_len, num_gpu_blocks=num_blocks, defaults=budget_defaults(cfg)
    )
    return dataclasses.replace(resolved, pipeline_parallel_size=cfg.pipeline_parallel_size)
