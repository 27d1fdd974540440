"""Regenerate the gRPC code from the .proto files: `python -m scaler.proto` (or `--check` to only compare).

The generated modules are committed so that installing needs no compiler; this command is the
one way to make them, and a test fails when they differ from what it would produce.
"""

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOURCES = sorted(HERE.glob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Run protoc into `out` (which receives a `scaler/proto/` folder) and list what it wrote."""
    from grpc_tools import protoc  # dev-only dependency, so imported late

    args = ["protoc", f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}"]
    args += [str(p.relative_to(ROOT)) for p in SOURCES]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out / "scaler" / "proto").glob("*_pb2*.py*"))


def stale() -> list[str]:
    """Names of generated files that are missing or differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        return [f.name for f in fresh if not (HERE / f.name).exists() or (HERE / f.name).read_bytes() != f.read_bytes()]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scaler.proto", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the generated code is stale")
    check = parser.parse_args().check
    if check:
        names = stale()
        if names:
            sys.exit(f"stale generated code: {', '.join(names)}; run `python -m scaler.proto`")
        print("generated code is up to date")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for f in generate(Path(tmp)):
            (HERE / f.name).write_bytes(f.read_bytes())
            print(f"wrote scaler/proto/{f.name}")


if __name__ == "__main__":
    main()
