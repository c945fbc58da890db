"""The Vidur peer's stand-in attention profile and command (Vidur itself is not installed
here: what it reads is checked against its format, and the command against the case)."""

from __future__ import annotations

import csv
import shlex
from pathlib import Path

import pytest

from bench import simulator, vidur_peer


def test_stand_in_profile_has_vidurs_columns_and_the_cases_shape(tmp_path: Path) -> None:
    path = tmp_path / "attention.csv"
    assert vidur_peer.main(["attention", str(path)]) == 0
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == vidur_peer.COLUMNS
    # Llama-2-70B as Vidur keys it: the model's own widths, split by the TP column
    assert {(r["n_embd"], r["n_q_head"], r["n_kv_head"], r["num_tensor_parallel_workers"],
             r["block_size"]) for r in rows} == {("8192", "64", "8", "2", "16")}
    decodes = [r for r in rows if r["is_prefill"] == "False"]
    prefills = [r for r in rows if r["is_prefill"] == "True"]
    assert len(decodes) == len(vidur_peer.DECODE_BATCHES) * (len(vidur_peer.CONTEXTS) - 1)
    assert all(r["prefill_chunk_size"] == "0" and r["time_stats.attn_prefill.median"] == ""
               for r in decodes)
    assert all(r["batch_size"] == "1" and r["time_stats.attn_decode.median"] == ""
               and int(r["prefill_chunk_size"]) + int(r["kv_cache_size"]) <= 4096
               for r in prefills)
    assert all(float(r["time_stats.attn_kv_cache_save.median"]) > 0 for r in rows)


def _ms(rows: list[vidur_peer.AttentionRow], batch: int, chunk: int, context: int) -> float:
    (row,) = [r for r in rows if (r.batch_size, r.prefill_chunk_size, r.kv_cache_size)
              == (batch, chunk, context)]
    value = row.prefill_ms if chunk else row.decode_ms
    assert value is not None
    return value


def test_stand_in_times_are_the_step_models_per_layer() -> None:
    rows = vidur_peer.attention_rows()
    # more work never takes less time
    assert _ms(rows, 64, 0, 2048) > _ms(rows, 64, 0, 256) > 0
    assert _ms(rows, 128, 0, 1024) > _ms(rows, 8, 0, 1024)
    assert _ms(rows, 1, 512, 2048) > _ms(rows, 1, 512, 0) > _ms(rows, 1, 64, 0) > 0
    # per layer: one 512-token chunk's attention is a small part of a 177 ms step (80 layers)
    assert 0.01 < _ms(rows, 1, 512, 1024) < 1.0


def test_command_runs_vidur_on_the_cases_stream_and_deployment(tmp_path: Path) -> None:
    (tmp_path / "vidur").mkdir()
    attention = tmp_path / "attention.csv"
    attention.write_text("x\n")
    text = vidur_peer.vidur_command(tmp_path, attention, "py", "cache", "/tmp/out")
    cd, run = text.split(" && ")
    assert shlex.split(cd) == ["cd", str(tmp_path)]
    args = shlex.split(run)
    assert args[:3] == ["py", "-m", "vidur.main"]
    switches = [a for a in args if a.startswith("--no-")]  # plots and Chrome trace off
    assert switches == ["--no-metrics_config_store_plots",
                        "--no-metrics_config_enable_chrome_trace"]
    valued = [a for a in args[3:] if a not in switches]
    flags = dict(zip(valued[::2], valued[1::2], strict=True))
    assert all(k.startswith("--") and not v.startswith("--") for k, v in flags.items())
    assert flags["--trace_request_generator_config_trace_file"] == str(simulator.VIDUR_STREAM)
    assert flags["--replica_config_tensor_parallel_size"] == "2"
    assert flags["--sarathi_scheduler_config_chunk_size"] == "512"  # the token budget
    assert flags["--sarathi_scheduler_config_batch_size_cap"] == "128"  # max_num_seqs
    assert flags["--replica_config_model_name"] == "meta-llama/Llama-2-70b-hf"
    assert flags[
        "--random_forrest_execution_time_predictor_config_attention_input_file"
    ] == str(attention.resolve())


def test_command_refuses_what_is_not_there(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    attention = tmp_path / "attention.csv"
    argv = ["command", "--vidur-dir", str(tmp_path), "--attention", str(attention)]
    for said in ("is not a Vidur checkout", "no stand-in profile"):
        with pytest.raises(SystemExit) as exc:
            vidur_peer.main(argv)
        assert exc.value.code == 2 and said in capsys.readouterr().err
        (tmp_path / "vidur").mkdir(exist_ok=True)  # a checkout, for the second refusal
    attention.write_text("x\n")
    assert vidur_peer.main(argv) == 0
    assert capsys.readouterr().out.startswith(f"cd {tmp_path} && python -m vidur.main ")
