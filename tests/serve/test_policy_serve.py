"""``twinserve serve --scheduling-policy``: a user's policy class, written here, schedules a real
served tiny model (its run directory names it); a bad policy is one error line before any
process starts."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from engine.core.policy import VllmPolicy
from experiments.cli import main
from tests.serve.conftest import TINY_FLAGS, stop_and_check
from tests.serve.server import ServerProcess


class ServedPolicy(VllmPolicy):
    """vLLM's decisions, under a name of its own (it runs in the EngineCore process)."""

    def __init__(self, context: object) -> None:
        super().__init__(context)  # type: ignore[arg-type]
        self.name = "served-policy"


def test_a_users_policy_schedules_a_served_model(tiny_model: Path, tmp_path: Path) -> None:
    record_dir = tmp_path / "served"
    server = ServerProcess("--model", str(tiny_model), *TINY_FLAGS, "--scheduling-policy",
                           f"{__name__}:ServedPolicy", "--record-dir", str(record_dir),
                           "--no-plots")
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        for prompt in ("one", "two two", "three three three"):
            out = client.completions.create(model=str(tiny_model), prompt=prompt, max_tokens=3)
            assert out.usage is not None and out.usage.completion_tokens >= 1
    finally:
        assert stop_and_check(server) == 0, server.output
    meta = json.loads((record_dir / "config.json").read_text())
    assert meta["scheduling_policy"]["name"] == "served-policy"
    assert meta["scheduling_policy"]["class"] == f"{__name__}:ServedPolicy"


@pytest.mark.parametrize("argv,message", [
    (["--scheduling-policy", "edf"],
     "scheduling policy 'edf' needs per-request SLOs, and the workload's requests carry no SLO "
     "class"),
    (["--scheduling-policy", "nowhere.at_all:Policy"],
     "scheduling policy 'nowhere.at_all:Policy': cannot import module 'nowhere.at_all'"),
    (["--scheduling-policy", "vtc", "--policy-option", "output_weight=-1"],
     "VTC weights must be >= 0"),
])
def test_serve_refuses_a_bad_policy_before_starting(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["serve", "--emulate", "--model", "meta-llama/Llama-3.1-8B", "--port", "0", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("twinserve: error: ")
    assert message in err[0]


def test_a_policy_option_must_be_key_equals_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--emulate", "--model", "meta-llama/Llama-3.1-8B",
              "--scheduling-policy", "vtc", "--policy-option", "weight"])
    assert exc.value.code == 2
    assert "--policy-option: expected KEY=VALUE, got 'weight'" in capsys.readouterr().err
