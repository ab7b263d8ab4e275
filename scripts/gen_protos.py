"""Generate the Python gRPC code for protos/ferrum/v1/*.proto into ferrum/v1/.

The proto files are the only definition of gRPC messages; this script is the
only producer of the generated package, so nobody edits it by hand. With
``--check`` it regenerates into a temporary directory and exits 1 when the
checked-out package differs (a stale build after a proto change).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = ROOT / "ferrum"
HEADER = '"""Generated from protos/ by scripts/gen_protos.py. Do not edit."""\n'


def generate(out_dir: Path) -> None:
    """Run protoc (grpc_tools) for every proto into out_dir/ferrum/v1."""
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    # mypy-protobuf's plugin types the *_pb2_grpc modules (stubs, servicers,
    # add_*_to_server) the way --pyi_out types the messages, so mypy checks
    # every gRPC call site instead of seeing Any.
    plugin = Path(sys.executable).parent / "protoc-gen-mypy_grpc"
    if not plugin.exists():
        found = shutil.which("protoc-gen-mypy_grpc")
        if found is None:
            raise SystemExit("protoc-gen-mypy_grpc not found: pip install mypy-protobuf")
        plugin = Path(found)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy_grpc={plugin}",
        f"--mypy_grpc_out=quiet:{out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for package in (out_dir / "ferrum", out_dir / "ferrum" / "v1"):
        (package / "__init__.py").write_text(HEADER)


def differences(left: Path, right: Path) -> list[str]:
    """Names of files that differ, are missing or are extra between two trees."""
    found: list[str] = []
    cmp = filecmp.dircmp(left, right, ignore=["__pycache__"])
    found += [f"only in generated: {n}" for n in cmp.left_only]
    found += [f"only in package: {n}" for n in cmp.right_only]
    found += [f"differs: {n}" for n in cmp.diff_files]
    for sub in cmp.subdirs.values():
        found += differences(Path(sub.left), Path(sub.right))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if ferrum/ is stale")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / "ferrum"
        if options.check:
            if not PACKAGE_DIR.exists():
                print("ferrum/ is missing: run scripts/gen_protos.py", file=sys.stderr)
                return 1
            diff = differences(fresh, PACKAGE_DIR)
            if diff:
                print("generated code is stale: " + "; ".join(diff), file=sys.stderr)
                return 1
            return 0
        if PACKAGE_DIR.exists():
            shutil.rmtree(PACKAGE_DIR)
        shutil.copytree(fresh, PACKAGE_DIR)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
