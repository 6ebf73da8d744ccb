"""Regenerate the Python stubs from the .proto files in ``common/perseus_common/proto/``.

Usage::

    python scripts/gen_proto.py            # write next to the .proto files (the committed stubs)
    python scripts/gen_proto.py --out DIR  # write them into DIR

``perseus.proto`` (the plan-push gRPC protocol) gives ``perseus_pb2.py``, its ``.pyi``,
``perseus_pb2_grpc.py`` and its ``.pyi``; ``gpud.proto`` (the node daemon's messages, no service)
gives ``gpud_pb2.py`` and its ``.pyi``. The .proto files are compiled with ``common/`` as the
include root, so the generated gRPC module imports its messages as
``from perseus_common.proto import perseus_pb2`` and works from any directory.
``tests/common/test_proto.py`` checks that the committed stubs match a fresh generation.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["PROTO", "GPUD_PROTO", "OUTPUTS", "generate", "main"]

ROOT = Path(__file__).resolve().parent.parent
COMMON = ROOT / "common"
PROTO = COMMON / "perseus_common" / "proto" / "perseus.proto"
GPUD_PROTO = PROTO.with_name("gpud.proto")
#: What each .proto compiles to (file names in the proto directory).
OUTPUTS = {
    PROTO: ("perseus_pb2.py", "perseus_pb2.pyi", "perseus_pb2_grpc.py", "perseus_pb2_grpc.pyi"),
    GPUD_PROTO: ("gpud_pb2.py", "gpud_pb2.pyi"),
}


def generate(out_dir: Path) -> list[Path]:
    """Compile every .proto of :data:`OUTPUTS` into ``out_dir``; return the paths written.

    Its modules and type stubs are written into ``out_dir``.
    """
    from grpc_tools import protoc  # dev-time dependencies only: grpcio-tools, mypy-protobuf

    plugin = shutil.which("protoc-gen-mypy_grpc", path=str(Path(sys.executable).parent))
    if plugin is None:
        raise RuntimeError("protoc-gen-mypy_grpc not found: install the dev extra (mypy-protobuf)")

    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    written = []
    for proto, names in OUTPUTS.items():
        grpc = any(name.endswith("_grpc.py") for name in names)
        with tempfile.TemporaryDirectory() as tmp:
            args = [
                "grpc_tools.protoc",
                f"-I{COMMON}",
                f"-I{include}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
            ]
            if grpc:
                args += [
                    f"--grpc_python_out={tmp}",
                    f"--plugin=protoc-gen-mypy_grpc={plugin}",
                    f"--mypy_grpc_out={tmp}",
                ]
            rc = protoc.main([*args, proto.relative_to(COMMON).as_posix()])
            if rc != 0:
                raise RuntimeError(f"protoc failed on {proto.name} with exit status {rc}")
            for name in names:
                dst = out_dir / name
                shutil.copyfile(Path(tmp) / proto.parent.relative_to(COMMON) / name, dst)
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
