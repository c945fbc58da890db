"""Bad input gives one clear error: a ``UserError`` subclass, one line on the CLI, exit 2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.core.errors import UserError
from engine.worker.errors import CheckpointError, KVCacheSizeError, UnsupportedModelError
from experiments.cli import main
from workload.admission import PromptError

Corrupt = Callable[[Path], None]


def _edit_config(**changes: object) -> Corrupt:
    def edit(d: Path) -> None:
        config = json.loads((d / "config.json").read_text())
        config.update(changes)
        (d / "config.json").write_text(json.dumps(config))
    return edit


def _truncate(name: str) -> Corrupt:
    def cut(d: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: len(data) // 2])
    return cut


def _drop_tensor(d: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


CHECKPOINT_CASES: dict[str, tuple[Corrupt, type[UserError], str]] = {
    "no-config": (lambda d: (d / "config.json").unlink(), CheckpointError, "config.json"),
    "config-not-json": (
        lambda d: (d / "config.json").write_text("{oops"), CheckpointError, "not valid JSON"
    ),
    "unsupported-arch": (
        _edit_config(architectures=["GPT2LMHeadModel"]), UnsupportedModelError, "GPT2LMHeadModel"
    ),
    "unsupported-rope": (
        _edit_config(rope_scaling={"rope_type": "yarn", "factor": 2.0}),
        UnsupportedModelError, "yarn",
    ),
    "no-weights": (lambda d: (d / "model.safetensors").unlink(), CheckpointError, "no weights"),
    "garbage-weights": (
        lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64), CheckpointError,
        "model.safetensors",
    ),
    "truncated-weights": (_truncate("model.safetensors"), CheckpointError, "model.safetensors"),
    "missing-tensor": (_drop_tensor, CheckpointError, "mlp.up_proj"),
    "wrong-shape": (_edit_config(intermediate_size=96), CheckpointError, "expected"),
}


@pytest.fixture
def broken_dir(tmp_path: Path, llama_dir: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(llama_dir, target)
    return target


def cli_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinserve: error: ") and err.count("\n") == 1, err
    return err


def generate_argv(model: Path, *extra: str) -> list[str]:
    return ["generate", "--model", str(model), "--device", "cpu", "--prompt-token-ids", "1,2,3",
            "--max-tokens", "2", *extra]


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_bad_checkpoint(case: str, broken_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt, error_type, fragment = CHECKPOINT_CASES[case]
    corrupt(broken_dir)
    from engine.llm import LLM

    with pytest.raises(error_type, match=fragment):
        LLM(str(broken_dir), device="cpu")
    assert fragment in cli_error(capsys, generate_argv(broken_dir))


def test_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "does not exist" in cli_error(capsys, generate_argv(tmp_path / "nope"))


def test_sharded_index_with_a_missing_shard(
    tmp_path: Path, qwen2_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "model"
    shutil.copytree(qwen2_dir, target)
    (target / "model-00002-of-00002.safetensors").unlink()
    assert "model-00002-of-00002.safetensors" in cli_error(capsys, generate_argv(target))


def test_prompt_longer_than_max_model_len(
    llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.llm import LLM

    llm = LLM(str(llama_dir), device="cpu", max_model_len=8, kv_cache_memory=1 << 20)
    with pytest.raises(PromptError, match="longer than the maximum model length of 8"):
        llm.generate([list(range(9))])
    with pytest.raises(PromptError, match="out of vocabulary"):
        llm.generate([[1, 2, 100_000]])
    with pytest.raises(PromptError, match="empty"):
        llm.generate([[]])
    err = cli_error(capsys, [*generate_argv(llama_dir), "--max-model-len", "2"])
    assert "longer than the maximum model length" in err


@pytest.mark.parametrize(
    "flags",
    [["--kv-cache-memory", "4KiB"], ["--num-gpu-blocks", "3"],
     ["--kv-cache-memory", "256KiB", "--max-model-len", "1024", "--block-size", "128"]],
)
def test_impossible_kv_cache(
    flags: list[str], llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = cli_error(capsys, [*generate_argv(llama_dir), *flags])
    assert "KV cache" in err and "max_model_len" in err


def test_impossible_kv_cache_type(llama_dir: Path) -> None:
    from engine.llm import LLM

    with pytest.raises(KVCacheSizeError):
        LLM(str(llama_dir), device="cpu", num_gpu_blocks=2)


def test_other_user_errors(llama_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "max_position_embeddings" in cli_error(
        capsys, [*generate_argv(llama_dir), "--max-model-len", "4096"]
    )
    assert "temperature" in cli_error(capsys, [*generate_argv(llama_dir), "--temperature", "-1"])
    assert "cuda" in cli_error(capsys, [*generate_argv(llama_dir), "--device", "cuda:0"]).lower()
    assert "float64" in cli_error(capsys, [*generate_argv(llama_dir), "--dtype", "float64"])
