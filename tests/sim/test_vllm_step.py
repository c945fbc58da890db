"""Physics of the vLLM step cost model: each term grows as it should, padding follows vLLM's
captured sizes, fp8 halves the bytes, the breakdown adds up, and the bulk shortcut is exact."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import ConfigError
from engine.core.outputs import BatchShape
from sim.config import EngineKnobs, SimConfig, kv_capacity
from sim.cost.comm import TensorParallelComm, fused_norm_max_bytes
from sim.cost.cuda_graphs import EAGER, FULL, PIECEWISE, CudaGraphPlan, capture_sizes
from sim.cost.host import HostCosts
from sim.cost.kernel_tables import load_tables
from sim.cost.vllm_step import TERM_NAMES, VllmStepCostModel
from sim.hardware import get_gpu
from sim.model_catalog import get_model
from sim.runtime import make_cost_model

H100, H200, A100 = get_gpu("h100-sxm"), get_gpu("h200-sxm"), get_gpu("a100-80gb")
LLAMA8B, LLAMA70B = get_model("llama-3.1-8b"), get_model("llama-3.1-70b")


def decode(n: int, ctx: int) -> BatchShape:
    return BatchShape(n, n, (), (), n, n * ctx, ctx, n)


def prefill(q: int, ctx: int = 0) -> BatchShape:
    return BatchShape(1, q, (q,), (ctx,), 0, 0, 0, 1)


def term(model: VllmStepCostModel, shape: BatchShape, name: str) -> float:
    return dict(model.step_time(shape).terms)[name]


@pytest.fixture(scope="module")
def m8() -> VllmStepCostModel:
    return VllmStepCostModel(LLAMA8B, H100)


# -- GEMMs ---------------------------------------------------------------------------------------
def test_gemm_is_weight_bound_for_few_tokens_and_compute_bound_for_many() -> None:
    curve = load_tables("h100_sxm").gemm_curve("bfloat16", 4096.0, 4096.0)
    # memory bound: 1 to 64 tokens read the same 32 MiB of weights
    assert curve.at(64) / curve.at(1) < 1.3
    # compute bound: twice the tokens, about twice the time
    assert curve.at(16384) / curve.at(8192) == pytest.approx(2.0, rel=0.15)
    # the crossover lies near peak FLOP/s over bandwidth (989e12 / 3.35e12 ≈ 295 tokens)
    ratio = [curve.at(2 * m) / curve.at(m) for m in (32, 64, 128, 256, 512, 1024, 2048)]
    knee = [m for m, r in zip((32, 64, 128, 256, 512, 1024, 2048), ratio, strict=True) if r > 1.5]
    assert 128 <= knee[0] <= 1024


def test_gemm_keeps_the_measured_tile_steps() -> None:
    tables = load_tables("h100_sxm")
    ms = tables.gemm_m
    cells = tables.gemm_cells("bfloat16")
    i128, i129 = ms.index(128.0), ms.index(129.0)
    steps = [(nk, row) for nk, row in cells.items() if row[i129] > 1.05 * row[i128]]
    assert steps, "the H100 table shows tile steps at 128 -> 129 tokens"
    (n, k), row = steps[0]
    curve = tables.gemm_curve("bfloat16", n, k)
    assert curve.at(129) == pytest.approx(row[i129]) and curve.at(128) == pytest.approx(row[i128])


def test_gemm_terms_grow_with_tokens(m8: VllmStepCostModel) -> None:
    times = [term(m8, prefill(q), "gemm.gate_up") for q in (600, 1200, 2400, 4800)]
    assert times == sorted(times)
    assert times[-1] / times[-2] == pytest.approx(2.0, rel=0.15)


def test_fp8_gemms_are_faster_than_bf16_when_compute_bound() -> None:
    bf16 = VllmStepCostModel(LLAMA8B, H100)
    fp8 = VllmStepCostModel(LLAMA8B, H100, weight_dtype="fp8")
    for name in ("gemm.qkv", "gemm.o", "gemm.gate_up", "gemm.down"):
        assert term(fp8, prefill(4096), name) < 0.95 * term(bf16, prefill(4096), name)
        assert term(fp8, decode(1, 100), name) < term(bf16, decode(1, 100), name)
    for name in ("gemm.qkv", "gemm.gate_up", "gemm.down"):
        # weight-read bound: half the bytes (plus the kernels' fixed costs)
        assert term(fp8, decode(1, 100), name) < 0.8 * term(bf16, decode(1, 100), name)
    # the largest GEMM reaches most of the fp8 peak's gain
    assert term(fp8, prefill(4096), "gemm.gate_up") < 0.7 * term(
        bf16, prefill(4096), "gemm.gate_up")


# -- attention -----------------------------------------------------------------------------------
def test_decode_attention_grows_with_context_and_batch(m8: VllmStepCostModel) -> None:
    by_ctx = [term(m8, decode(32, c), "attention.decode") for c in (512, 2048, 8192, 32768)]
    assert by_ctx == sorted(by_ctx)
    # at long context the time is proportional to the KV read
    assert by_ctx[-1] / by_ctx[-2] == pytest.approx(4.0, rel=0.2)
    by_batch = [term(m8, decode(b, 4096), "attention.decode") for b in (8, 32, 128)]
    assert by_batch == sorted(by_batch)


def test_decode_attention_is_no_faster_than_its_longest_context(m8: VllmStepCostModel) -> None:
    # 8 requests, one of them at 64k context: not the time of 8 requests at the 8k mean
    long_one = BatchShape(8, 8, (), (), 8, 7 * 100 + 65536, 65536, 8)
    assert term(m8, long_one, "attention.decode") >= term(m8, decode(1, 65536), "attention.decode")


def test_fp8_kv_cache_halves_the_long_context_attention_read() -> None:
    bf16 = VllmStepCostModel(LLAMA8B, H100)
    fp8 = VllmStepCostModel(LLAMA8B, H100, kv_cache_dtype="fp8")
    ratio = term(fp8, decode(64, 16384), "attention.decode") / term(
        bf16, decode(64, 16384), "attention.decode")
    assert 0.35 < ratio < 0.75
    # A100 has no fp8-KV rows: estimated as the bf16 kernel at half the length
    a_bf16 = VllmStepCostModel(LLAMA8B, A100)
    a_fp8 = VllmStepCostModel(LLAMA8B, A100, kv_cache_dtype="fp8")
    assert term(a_fp8, decode(64, 16384), "attention.decode") == pytest.approx(
        term(a_bf16, decode(64, 8192), "attention.decode"), rel=0.02)


def test_prefill_attention_is_quadratic_and_a_cached_context_costs(
        m8: VllmStepCostModel) -> None:
    t4k, t8k = (term(m8, prefill(q), "attention.prefill") for q in (4096, 8192))
    assert t8k / t4k == pytest.approx(4.0, rel=0.3)
    assert term(m8, prefill(512, 3584), "attention.prefill") > term(
        m8, prefill(512), "attention.prefill")


def test_mixed_step_pays_one_attention_kernel_floor(m8: VllmStepCostModel) -> None:
    mixed = BatchShape(9, 520, (512,), (0,), 8, 8 * 1000, 1000, 9)
    both = term(m8, mixed, "attention.decode") + term(m8, mixed, "attention.prefill")
    apart = term(m8, decode(8, 1000), "attention.decode") + term(
        m8, prefill(512), "attention.prefill")
    assert both < apart
    assert apart - both < 32 * 20e-6  # one floor per layer, not more


def test_attention_pairs_not_in_the_tables_are_interpolated_or_scaled() -> None:
    tables = load_tables("h100_sxm")
    between = tables.attention_grid("decode", "bfloat16", 28, 4)  # Qwen2.5-7B
    assert between.how.startswith("between")
    lo = tables.attention_grid("decode", "bfloat16", 24, 4).grid.at(32, 4096)
    hi = tables.attention_grid("decode", "bfloat16", 32, 4).grid.at(32, 4096)
    assert min(lo, hi) <= between.grid.at(32, 4096) <= max(lo, hi)
    mha = tables.attention_grid("decode", "bfloat16", 32, 32)  # Llama-2-7B: no MHA decode rows
    assert "estimate" in mha.how
    assert mha.grid.at(32, 4096) > 3 * tables.attention_grid(
        "decode", "bfloat16", 8, 8).grid.at(32, 4096)


# -- communication -------------------------------------------------------------------------------
def test_allreduce_grows_with_size_and_tp_and_graphs_are_cheaper_than_eager() -> None:
    tables = load_tables("h100_sxm")
    sizes = [2**k for k in range(10, 28, 2)]
    for tp in (2, 4, 8):
        comm = TensorParallelComm(tables, tp)
        graph = [comm.allreduce_s(b, graph=True) for b in sizes]
        # (measured: flat within noise at small sizes, then proportional to the bytes)
        assert all(b >= a * 0.9 for a, b in itertools.pairwise(graph))
        assert graph[-1] > 5 * graph[0]
        assert all(comm.allreduce_s(b, graph=True) <= comm.allreduce_s(b, graph=False)
                   for b in sizes[:5])
    small = 64 * 8192 * 2
    assert TensorParallelComm(tables, 8).allreduce_s(small, True) >= TensorParallelComm(
        tables, 2).allreduce_s(small, True)
    assert TensorParallelComm(tables, 1).allreduce_s(small, True) == 0.0


def test_tp_step_has_measured_allreduces_and_fused_norms() -> None:
    tp1 = VllmStepCostModel(LLAMA70B, H200, 1)
    tp4 = VllmStepCostModel(LLAMA70B, H200, 4)
    assert term(tp1, decode(4, 5120), "allreduce") == 0.0
    ar = term(tp4, decode(4, 5120), "allreduce")
    per_call = ar / (2 * 80 + 1)
    assert 3e-6 < per_call < 30e-6  # vLLM's custom all-reduce at decode sizes, not 28 µs
    # Hopper fuses the all-reduce with the next add + RMSNorm below 2 MiB at TP 4
    assert fused_norm_max_bytes(90, 4) == 2 * 2**20 and fused_norm_max_bytes(80, 4) == 0.0
    assert term(tp4, decode(4, 5120), "norm.add_rmsnorm") < 0.05 * term(
        tp1, decode(4, 5120), "norm.add_rmsnorm")
    # TP splits the weight reads: the step is faster, but not 4x (the all-reduces)
    t1, t4 = tp1.step_time(decode(4, 5120)).total_s, tp4.step_time(decode(4, 5120)).total_s
    assert 2.0 < t1 / t4 < 4.0


# -- CUDA graphs ---------------------------------------------------------------------------------
def test_capture_sizes_follow_vllm_033() -> None:
    h100 = capture_sizes(1024, 8192)
    assert h100[:5] == (1, 2, 4, 8, 16) and h100[-1] == 512
    assert [s for s in h100 if 240 <= s <= 288] == [240, 248, 256, 272, 288]
    assert len(h100) == 3 + 31 + 17
    # A100 server defaults (256 sequences, 2048 tokens): max min(512, 512); 256 is captured
    assert capture_sizes(256, 2048, sm_version=80)[-1] == 512
    # data-centre Blackwell: up to 1024
    assert capture_sizes(1024, 8192, sm_version=100)[-1] == 1024
    # a small token budget caps the sizes and is captured itself; max_num_seqs is too
    assert capture_sizes(100, 200) == (1, 2, 4, *range(8, 200, 8), 100, 200) or capture_sizes(
        100, 200) == tuple(sorted({1, 2, 4, *range(8, 200, 8), 100, 200}))
    assert capture_sizes(1024, 8192, enforce_eager=True) == ()
    assert capture_sizes(1024, 8192, cudagraph_capture_sizes=[4, 1, 64]) == (1, 4, 64)
    assert capture_sizes(1024, 8192, max_cudagraph_capture_size=128)[-1] == 128
    with pytest.raises(ConfigError, match="must equal the largest"):
        capture_sizes(1024, 8192, max_cudagraph_capture_size=100, cudagraph_capture_sizes=[64])


def test_dispatch_pads_to_the_next_captured_size() -> None:
    plan = CudaGraphPlan(capture_sizes(1024, 8192), 1024)
    assert plan.dispatch(1, True) == (FULL, 1)
    assert plan.dispatch(3, True) == (FULL, 4)
    assert plan.dispatch(129, True) == (FULL, 136)
    assert plan.dispatch(257, True) == (FULL, 272)
    assert plan.dispatch(129, False) == (PIECEWISE, 136)
    assert plan.dispatch(512, False) == (PIECEWISE, 512)
    assert plan.dispatch(513, True) == (EAGER, 513)
    # FULL only up to max_num_seqs: a larger decode batch replays piecewise graphs
    assert CudaGraphPlan(capture_sizes(64, 8192), 64).dispatch(100, True) == (PIECEWISE, 104)


def test_decode_cost_is_flat_within_a_capture_bucket(m8: VllmStepCostModel) -> None:
    dense = ("gemm.qkv", "gemm.o", "gemm.gate_up", "gemm.down", "rotary", "silu_and_mul")
    at = {n: dict(m8.step_time(decode(n, 1000)).terms) for n in (64, 129, 133, 136, 137, 256)}
    for name in dense:
        # 129..136 run the graph captured at 136: the same kernels
        assert at[129][name] == at[133][name] == at[136][name]
        assert at[256][name] > at[64][name]


def test_enforce_eager_removes_padding_and_pays_launches() -> None:
    graphs = CudaGraphPlan(capture_sizes(1024, 8192, enforce_eager=True), 1024)
    eager = VllmStepCostModel(LLAMA8B, H100, graphs=graphs)
    default = VllmStepCostModel(LLAMA8B, H100)
    ex_e, ex_d = eager.explain(decode(129, 1000)), default.explain(decode(129, 1000))
    assert (ex_e.mode, ex_e.padded_tokens) == ("eager", 129)
    assert (ex_d.mode, ex_d.padded_tokens) == ("full", 136)
    assert ex_e.launch_s > 20 * ex_d.launch_s
    # a model small enough to be launch bound: the device waits for the host
    tiny = VllmStepCostModel(LLAMA8B, H100, graphs=graphs,
                             host=HostCosts(kernel_launch_s=5e-4))
    st = tiny.step_time(decode(1, 10))
    assert dict(st.terms)["launch_bound"] > 0 and st.total_s == pytest.approx(st.launch_s)


# -- dtypes and memory ---------------------------------------------------------------------------
def test_fp8_halves_weight_and_kv_bytes_and_doubles_the_kv_blocks() -> None:
    fp8 = LLAMA70B.with_dtypes(fp8_weights=True, fp8_kv_cache=True)
    assert fp8.kv_bytes_per_token * 2 == LLAMA70B.kv_bytes_per_token
    layers = LLAMA70B.num_layers * (LLAMA70B.attn_params + LLAMA70B.mlp_params)
    assert LLAMA70B.weight_bytes - fp8.weight_bytes == layers  # one byte less per parameter
    base = SimConfig(model="llama-3.1-8b", gpu="h100-sxm")
    kv8 = SimConfig(model="llama-3.1-8b", gpu="h100-sxm", kv_cache_dtype="fp8")
    a, b = kv_capacity(base), kv_capacity(kv8)
    assert a.kv_bytes == b.kv_bytes and b.bytes_per_block * 2 == a.bytes_per_block
    assert b.num_gpu_blocks in (2 * a.num_gpu_blocks, 2 * a.num_gpu_blocks + 1)


def test_fp8_is_refused_on_gpus_without_fp8() -> None:
    with pytest.raises(ConfigError, match="fp8 tensor cores"):
        SimConfig(gpu="a100-80gb", quantization="fp8")
    with pytest.raises(ConfigError, match="fp8 tensor cores"):
        VllmStepCostModel(LLAMA8B, A100, weight_dtype="fp8")
    SimConfig(gpu="a100-80gb", kv_cache_dtype="fp8")  # fp8 KV runs on A100 (vLLM supports it)


# -- the breakdown and the protocol --------------------------------------------------------------
SHAPES = (decode(1, 10), decode(64, 2048), decode(300, 100), decode(600, 500), prefill(4096),
          prefill(100, 7000), BatchShape(64, 575, (512,), (1536,), 63, 63 * 1024, 1024, 64))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_terms_are_named_nonnegative_and_sum_to_the_total(shape: BatchShape, tp: int) -> None:
    m = VllmStepCostModel(LLAMA70B, H200, tp)
    st = m.step_time(shape)
    names = [n for n, _ in st.terms]
    assert set(names) <= set(TERM_NAMES) and len(names) == len(set(names))
    assert all(v >= 0 for _, v in st.terms)
    assert math.fsum(v for _, v in st.terms) == pytest.approx(st.total_s, rel=1e-12)
    assert st.linear_s + st.attention_s + st.communication_s + st.overhead_s == pytest.approx(
        st.total_s)
    assert st.host_s > 0 and st.launch_s > 0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(n=st.integers(1, 1100), mean=st.integers(0, 40000), extra=st.integers(0, 90000),
       tp=st.sampled_from([1, 2, 4, 8]), kv=st.sampled_from(["bfloat16", "fp8"]))
def test_decode_shortcut_is_bit_identical_to_step_time(n: int, mean: int, extra: int, tp: int,
                                                       kv: str) -> None:
    m = _model(tp, kv)
    ctx_max = mean + extra
    ctx_sum = mean * (n - 1) + ctx_max
    shape = BatchShape(n, n, (), (), n, ctx_sum, ctx_max, n)
    st_ = m.step_time(shape)
    assert m.decode_step_total(n, ctx_sum, ctx_max) == st_.total_s
    assert m.decode_step_host(n) == (st_.host_s, st_.launch_s)


_MODELS: dict[tuple[int, str], VllmStepCostModel] = {}


def _model(tp: int, kv: str) -> VllmStepCostModel:
    key = (tp, kv)
    if key not in _MODELS:
        _MODELS[key] = VllmStepCostModel(LLAMA70B, H200, tp, kv_cache_dtype=kv)
    return _MODELS[key]


def test_default_cost_model_is_the_vllm_step_model_and_the_roofline_stays_by_name() -> None:
    from sim.cost.roofline import RooflineCostModel

    assert SimConfig().resolved_cost_model == "vllm"
    assert isinstance(make_cost_model(SimConfig()), VllmStepCostModel)
    assert isinstance(make_cost_model(SimConfig(cost_model="roofline")), RooflineCostModel)
    with pytest.raises(ConfigError, match="cost_model must be one of"):
        SimConfig(cost_model="fancy")
    # the engine's budgets size the graphs
    cfg = SimConfig(engine=EngineKnobs(max_num_seqs=64, max_num_batched_tokens=2048))
    model = make_cost_model(cfg)
    assert isinstance(model, VllmStepCostModel)
    assert model.graphs.max_size == 128 and 64 in model.graphs.sizes


@pytest.mark.parametrize("is_async", [True, False])
def test_costs_change_times_never_decisions(is_async: bool) -> None:
    # every request reaches the engine at once (a front end without costs): what the scheduler
    # decides cannot depend on time, so the roofline and the vLLM step model must make the same
    # steps (at other times)
    from sim.config import FrontendConfig
    from sim.runtime import run_simulation
    from workload.config import WorkloadConfig

    free = FrontendConfig(request_overhead_s=0.0, tokenize_s_per_token=0.0, ipc_latency_s=0.0)
    work = WorkloadConfig(dataset_name="random", num_prompts=120, request_rate=math.inf,
                          random_input_len=700, random_output_len=60, random_range_ratio=0.9)
    engine = EngineKnobs(async_scheduling=is_async, max_num_batched_tokens=2048, max_num_seqs=64)
    runs = [run_simulation(SimConfig(cost_model=c, workload=work, engine=engine,
                                     num_gpu_blocks=3000, frontend=free))
            for c in ("roofline", "vllm")]
    decisions = [{k: list(v) for k, v in r.event_log.steps_columns().items()
                  if not k.endswith("_s") and k != "kv_usage"} for r in runs]
    assert decisions[0] == decisions[1]
    times = [list(r.event_log.steps_columns()["execute_end_s"]) for r in runs]
    assert times[0] != times[1]


def test_shipped_tables_load_with_their_provenance() -> None:
    from sim.cost.kernel_tables import DATA_DIR, systems

    for name in ("gemm", "attn_decode", "attn_prefill", "allreduce", "nccl_collectives",
                 "coverage"):
        assert (DATA_DIR / f"{name}.csv").stat().st_size > 0
    assert (DATA_DIR / "NOTICE").read_text().count("aiconfigurator-core 0.12.0") == 2
    assert "Apache License" in (DATA_DIR / "LICENSE-Apache-2.0").read_text()
    assert {"a100_sxm", "h100_sxm", "h200_sxm"} <= set(systems())
    for system in systems():
        tables = load_tables(system)
        for (table, _dtype), src in tables.sources.items():
            assert src.version and src.kernel, (system, table)
        for (n, k), row in tables.gemm_cells("bfloat16").items():
            finite = [v for v in row if not math.isnan(v)]
            assert finite and all(v > 0 for v in finite), (system, n, k)


def test_a_gpu_without_tables_falls_back_to_the_roofline(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from sim import hardware
    from sim.cost.roofline import RooflineCostModel

    bare = dataclasses.replace(H100, name="h100-bare", kernel_tables=None)
    monkeypatch.setitem(hardware.GPUS, "h100-bare", bare)
    assert SimConfig(gpu="h100-bare").resolved_cost_model == "roofline"
    assert isinstance(make_cost_model(SimConfig(gpu="h100-bare")), RooflineCostModel)
    with pytest.raises(ConfigError, match="needs measured kernel tables"):
        SimConfig(gpu="h100-bare", cost_model="vllm")


@given(st.lists(st.floats(-1e6, 1e6), max_size=40), st.floats(-2e6, 2e6))
def test_interp_bisect_right_is_the_library_s(values: list[float], x: float) -> None:
    import bisect

    from sim.cost.interp import bisect_right

    xs = sorted(values)
    assert bisect_right(xs, x) == bisect.bisect_right(xs, x)
    for v in xs:  # at each value (duplicates included)
        assert bisect_right(xs, v) == bisect.bisect_right(xs, v)


@given(
    st.lists(st.floats(1.0, 1e6), min_size=1, max_size=12, unique=True),
    st.lists(st.floats(0.5, 2e6), min_size=1, max_size=30),
    st.booleans(),
)
def test_interp_lookups_in_any_order_equal_fresh_ones(
    xs: list[float], queries: list[float], log_x: bool
) -> None:
    """A curve and a grid keep the segment of their last lookup; a sequence of lookups gives,
    bit for bit, what each would give on a fresh object (no state carried over)."""
    import bisect
    import math

    from sim.cost.interp import Curve, Grid

    xs = sorted(xs)
    ys = [1.0 + (7.0 * i) % 5.0 for i in range(len(xs))]

    def curve() -> Curve:
        return Curve(xs, ys, log_x=log_x, exponent=2.0)

    def grid() -> Grid:
        return Grid(xs, [curve() for _ in xs])

    def reference(x: float) -> float:  # the curve's definition, segment found afresh
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * (x / xs[-1]) ** 2.0
        j = bisect.bisect_right(xs, x)
        if log_x:
            w = (math.log(x) - math.log(xs[j - 1])) / (math.log(xs[j]) - math.log(xs[j - 1]))
            return math.exp(math.log(ys[j - 1]) + w * (math.log(ys[j]) - math.log(ys[j - 1])))
        return ys[j - 1] + (x - xs[j - 1]) / (xs[j] - xs[j - 1]) * (ys[j] - ys[j - 1])

    c, g = curve(), grid()
    for q in queries:
        got = c.at(q)
        assert got == curve().at(q)
        assert got == pytest.approx(reference(q), rel=1e-9)
        assert g.at(q, 2.0 * q) == grid().at(q, 2.0 * q)
