"""Regenerate the gRPC Python stubs from ``common/perseus_common/proto/perseus.proto``.

Usage::

    python scripts/gen_proto.py            # write next to the .proto (the committed stubs)
    python scripts/gen_proto.py --out DIR  # write DIR/perseus_pb2.py, its .pyi and DIR/perseus_pb2_grpc.py

The .proto is compiled with ``common/`` as the include root, so the generated gRPC module imports
its messages as ``from perseus_common.proto import perseus_pb2`` and works from any directory.
``tests/test_proto.py`` checks that the committed stubs match a fresh generation.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["PROTO", "generate", "main"]

ROOT = Path(__file__).resolve().parent.parent
COMMON = ROOT / "common"
PROTO = COMMON / "perseus_common" / "proto" / "perseus.proto"
OUTPUTS = ("perseus_pb2.py", "perseus_pb2.pyi", "perseus_pb2_grpc.py", "perseus_pb2_grpc.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Compile the .proto and write the stub modules (and the messages' type stub) into ``out_dir``; return their paths."""
    from grpc_tools import protoc  # dev-time dependencies only: grpcio-tools, mypy-protobuf

    plugin = shutil.which("protoc-gen-mypy_grpc", path=str(Path(sys.executable).parent))
    if plugin is None:
        raise RuntimeError("protoc-gen-mypy_grpc not found: install the dev extra (mypy-protobuf)")

    out_dir.mkdir(parents=True, exist_ok=True)
    rel = PROTO.relative_to(COMMON).as_posix()
    with tempfile.TemporaryDirectory() as tmp:
        include = Path(protoc.__file__).parent / "_proto"
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{COMMON}",
                f"-I{include}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                f"--plugin=protoc-gen-mypy_grpc={plugin}",
                f"--mypy_grpc_out={tmp}",
                rel,
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit status {rc}")
        written = []
        for name in OUTPUTS:
            dst = out_dir / name
            shutil.copyfile(Path(tmp) / PROTO.parent.relative_to(COMMON) / name, dst)
            written.append(dst)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO.parent, help="output directory")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
