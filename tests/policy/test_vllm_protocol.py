"""What the `remote` backend sends and what `agentloop inference` answers, checked against vLLM's own pydantic
protocol models (scripts/vllm_protocol.py; `make vllm-protocol` installs them apart, `make test` does it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_SERVICES

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / ".vllm-protocol"


def test_requests_and_responses_match_vllms_protocol_models(tiny_model_dir):
    if not (VLLM / "vllm").is_dir():
        reason = "vLLM's protocol models are not installed: run `make vllm-protocol`"
        if REQUIRE_SERVICES:
            pytest.fail(reason)
        pytest.skip(reason)
    env = {**os.environ, "PYTHONPATH": str(VLLM), "AGENTLOOP_MODEL": str(tiny_model_dir)}
    env["AGENTLOOP_TORCH_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "vllm_protocol.py"), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["problems"] == [] and proc.returncode == 0, proc.stderr[-3000:]
    assert result["vllm"] == "0.34.0"
    checked = result["checked"]
    assert checked["POST /v1/completions request"] == 3 and checked["POST /v1/completions response"] == 2
    assert checked["POST /v1/load_lora_adapter request"] == 1 and checked["POST /v1/unload_lora_adapter request"] == 1
    assert checked["GET /v1/models response"] >= 1 and checked["error response"] >= 1
