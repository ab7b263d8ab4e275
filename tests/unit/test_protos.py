"""The generated gRPC package must match protos/ exactly."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_check() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_generated_code_is_fresh() -> None:
    result = run_check()
    assert result.returncode == 0, result.stderr


def test_stale_generated_code_is_detected() -> None:
    target = ROOT / "ferrum" / "v1" / "common_pb2.py"
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"\n# hand edit\n")
        result = run_check()
        assert result.returncode == 1
        assert "common_pb2.py" in result.stderr
    finally:
        target.write_bytes(original)


def test_every_service_is_generated() -> None:
    from ferrum.v1 import api_pb2, conductor_pb2, objectstore_pb2, renderer_pb2

    assert "NodeService" in api_pb2.DESCRIPTOR.services_by_name
    assert "ConductorService" in conductor_pb2.DESCRIPTOR.services_by_name
    assert "ObjectStore" in objectstore_pb2.DESCRIPTOR.services_by_name
    assert "BootScriptRenderer" in renderer_pb2.DESCRIPTOR.services_by_name
