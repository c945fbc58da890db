"""Models from their config.json: every shipped file loads and matches its published size, the
traps of each family are read right (head_dim, implicit biases, MLA, sliding windows), and bad
files are one clear error each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cli import main
from sim.config import ConfigError, SimConfig, kv_capacity
from sim.hf_config import ARCHITECTURES, ModelConfigError, load_model_config
from sim.model_catalog import DATA_DIR, catalog, get_model
from sim.models import UnknownModelError

ENTRIES = list(catalog().values())


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.spec.name for e in ENTRIES])
def test_every_shipped_config_matches_its_published_size(entry) -> None:  # type: ignore[no-untyped-def]
    m = entry.spec
    assert abs(m.total_params / entry.published_total_params - 1) <= 0.02
    if entry.published_active_params is not None:
        active = m.active_params - (m.embedding_params if entry.active_excludes_embedding else 0)
        # published active counts are rounded to 0.1B (DeepSeek-V2-Lite: 2.45B printed as 2.4B)
        assert abs(active / entry.published_active_params - 1) <= 0.025
        assert m.is_moe and active < m.total_params / 2


def test_the_catalog_covers_every_supported_family() -> None:
    families = {e.spec.architecture for e in ENTRIES}
    assert families == set(ARCHITECTURES)
    assert len(ENTRIES) >= 25
    assert (DATA_DIR / "SOURCES.md").read_text().count(".json |") >= len(ENTRIES)


def test_exact_counts_where_the_publisher_gives_one() -> None:
    assert get_model("meta-llama/Llama-3.1-8B").total_params == 8_030_261_248
    assert get_model("qwen2.5-72b").total_params == 72_706_203_648  # incl. implicit q/k/v biases
    assert get_model("Qwen/Qwen3-30B-A3B").total_params == 30_532_122_624
    assert get_model("openai/gpt-oss-120b").total_params == 116_829_156_672


def test_head_dim_is_read_not_derived() -> None:
    qwen3_32b = get_model("Qwen/Qwen3-32B")
    assert qwen3_32b.head_dim == 128 != qwen3_32b.hidden_size // qwen3_32b.num_heads
    assert get_model("openai/gpt-oss-20b").head_dim == 64  # 2880 / 64 heads = 45
    assert get_model("llama-3.1-70b").head_dim == 128  # no key: hidden / heads


def test_aliases_and_case() -> None:
    assert get_model("LLAMA-3.1-70B") is get_model("meta-llama/Llama-3.1-70B")
    assert get_model("mixtral-8x7b").name == "mistralai/Mixtral-8x7B-v0.1"
    assert get_model("deepseek-v3").is_mla


def test_moe_shapes_are_read_from_each_spelling() -> None:
    mixtral, qwen, ds = (get_model(n) for n in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"))
    assert (mixtral.num_experts, mixtral.num_experts_per_token, mixtral.intermediate_size) == (
        8, 2, 14336)
    assert (qwen.num_experts, qwen.num_experts_per_token, qwen.intermediate_size) == (128, 8, 768)
    assert (ds.num_experts, ds.num_dense_layers, ds.dense_intermediate_size) == (256, 3, 18432)
    assert ds.shared_expert_intermediate_size == 2048 and ds.num_moe_layers == 58
    assert get_model("Qwen/Qwen2-57B-A14B").shared_expert_gate


def test_mla_kv_bytes_per_token_and_replication_over_tp() -> None:
    v3, lite = get_model("deepseek-v3"), get_model("deepseek-ai/DeepSeek-V2-Lite")
    # one latent of kv_lora_rank + rope dims per layer, no separate V: (512 + 64) × 2 bytes
    assert v3.kv_bytes_per_token == 61 * 576 * 2 == 70_272
    assert lite.kv_bytes_per_token == 27 * 1152
    # MLA's latent is replicated on every TP rank; GQA's heads are split
    assert v3.kv_bytes_per_token_per_gpu(8) == v3.kv_bytes_per_token
    llama = get_model("llama-3.1-70b")
    assert llama.kv_bytes_per_token_per_gpu(8) == llama.kv_bytes_per_token / 8
    assert get_model("qwen2.5-7b").kv_bytes_per_token_per_gpu(8) == (
        get_model("qwen2.5-7b").kv_bytes_per_token / 4)  # 4 KV heads: replicated beyond TP 4
    fp8 = v3.with_dtypes(fp8_weights=False, fp8_kv_cache=True)
    assert fp8.kv_bytes_per_token * 2 == v3.kv_bytes_per_token
    cap = kv_capacity(SimConfig(model="deepseek-v3", gpu="h200-sxm", tensor_parallel_size=8))
    assert cap.bytes_per_block == 16 * 70_272


def test_sliding_window_layers_are_read_from_layer_types() -> None:
    oss = get_model("openai/gpt-oss-120b")
    assert (oss.sliding_window, oss.num_sliding_layers, oss.num_layers) == (128, 18, 36)
    # only the full-attention layers hold every token's K and V
    assert oss.kv_bytes_per_token == 18 * 2 * 8 * 64 * 2
    assert oss.sliding_kv_bytes_per_request_per_gpu(1, 16) == 18 * 144 * 2 * 8 * 64 * 2
    assert get_model("qwen2.5-7b").num_sliding_layers == 0  # use_sliding_window false


def test_checkpoint_formats() -> None:
    v3, oss = get_model("deepseek-v3"), get_model("gpt-oss-120b")
    assert v3.linear_weight_bytes == 1  # block-scaled fp8 checkpoint
    assert oss.expert_weight_bytes is not None and oss.expert_weight_bytes < 1  # MXFP4 experts
    assert oss.weight_bytes < 0.5 * oss.total_params * 2
    assert SimConfig(model="deepseek-v3", gpu="h200-sxm", tensor_parallel_size=8).weight_dtype \
        == "fp8"


def _write(tmp_path: Path, cfg: dict[str, object], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def test_a_config_json_path_or_directory_is_a_model(tmp_path: Path) -> None:
    cfg = json.loads((DATA_DIR / "meta-llama__Llama-3.1-8B.json").read_text())
    path = _write(tmp_path, cfg)
    from_file, from_dir = get_model(str(path)), get_model(str(tmp_path))
    shipped = get_model("meta-llama/Llama-3.1-8B")
    assert from_file.total_params == from_dir.total_params == shipped.total_params
    assert from_file.name == str(path)
    out = tmp_path / "run"
    code = main(["simulate", "--model", str(tmp_path), "--dataset-name", "random",
                 "--num-prompts", "20", "--random-input-len", "64", "--random-output-len", "8",
                 "--request-rate", "inf", "--no-plots", "--out", str(out)])
    assert code == 0 and (out / "summary.json").is_file()


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda c: c.pop("hidden_size"), "missing key(s) 'hidden_size' (needed for LlamaForCausalLM)"),
    (lambda c: [c.pop(k) for k in ("hidden_size", "num_attention_heads", "vocab_size")],
     "missing key(s) 'hidden_size', 'num_attention_heads', 'vocab_size' (needed for"),
    (lambda c: c.update(architectures=["MambaForCausalLM"]),
     "architecture 'MambaForCausalLM' is not supported; supported: LlamaForCausalLM"),
    (lambda c: c.update(num_hidden_layers=-3), "'num_hidden_layers' must be a positive integer"),
    (lambda c: c.update(quantization_config={"quant_method": "awq"}),
     "checkpoint quantization 'awq' is not priced"),
    (lambda c: c.update(num_key_value_heads=5), "not a multiple of num_key_value_heads 5"),
])
def test_bad_config_json_is_one_clear_error(tmp_path: Path, mutate, message: str,  # type: ignore[no-untyped-def]
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cfg = json.loads((DATA_DIR / "meta-llama__Llama-3.1-8B.json").read_text())
    mutate(cfg)
    path = _write(tmp_path, cfg)
    with pytest.raises(ModelConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model_config(path)
    assert main(["simulate", "--model", str(path), "--no-plots",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("twinserve: error: ") and err.count("\n") == 0 and message in err


def test_missing_moe_and_mla_fields_are_named(tmp_path: Path) -> None:
    cfg = json.loads((DATA_DIR / "deepseek-ai__DeepSeek-V3.json").read_text())
    for key in ("kv_lora_rank", "n_routed_experts"):
        cfg.pop(key)
    with pytest.raises(ModelConfigError, match="'kv_lora_rank', 'n_routed_experts'"):
        load_model_config(_write(tmp_path, cfg))


def test_unreadable_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"a model directory needs a config\.json"):
        get_model(str(tmp_path))
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ModelConfigError, match="not a JSON file"):
        get_model(str(bad))
    with pytest.raises(UnknownModelError, match=r"or a path to a config\.json"):
        get_model("no/such-model")


def test_expert_parallel_needs_a_moe_model(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--enable-expert-parallel needs a mixture-of-experts"):
        SimConfig(model="llama-3.1-8b", enable_expert_parallel=True)
    assert main(["simulate", "--model", "llama-3.1-8b", "--enable-expert-parallel",
                 "--no-plots", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("twinserve: error: --enable-expert-parallel needs a mixture-of-experts "
                   "model; meta-llama/Llama-3.1-8B (LlamaForCausalLM) is dense")


def test_list_models_shows_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--list-models"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-ai/DeepSeek-V3" in out and "MLA (latent 512+64)" in out
    assert "sliding window 128 on 18 layers" in out and "MoE 8/128" in out
