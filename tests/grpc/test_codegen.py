"""The checked-in generated modules are exactly what `make proto` makes from proto/ today."""

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "agentloop" / "proto_gen"


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_generated_modules_match_the_proto(tmp_path):
    out = tmp_path / "proto_gen"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    generated, checked_in = files_under(out), files_under(CHECKED_IN)
    assert generated == checked_in, "run `make proto` and commit agentloop/proto_gen"
    assert {"agentloop/v1/agent_pb2.py", "agentloop/v1/agent_pb2.pyi", "agentloop/v1/agent_pb2_grpc.py"} <= generated
    _, mismatch, errors = filecmp.cmpfiles(out, CHECKED_IN, sorted(generated), shallow=False)
    assert not mismatch and not errors, f"{mismatch + errors} differ from proto/: run `make proto` and commit them"


def test_generated_modules_import_from_their_package():
    from agentloop.proto_gen.agentloop.v1 import agent_pb2, agent_pb2_grpc

    assert agent_pb2_grpc.agentloop_dot_v1_dot_agent__pb2 is agent_pb2  # the same module, not a second copy
    assert agent_pb2.DESCRIPTOR.name == "agentloop/v1/agent.proto"  # the name clients and reflection see
    assert {s.full_name for s in agent_pb2.DESCRIPTOR.services_by_name.values()} == {
        "agentloop.v1.AgentService",
        "agentloop.v1.AdminService",
    }
