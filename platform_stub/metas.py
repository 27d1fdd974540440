"""Reading a dataset's `metas` file: one JSON object per line, one function each."""

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T")


class FunctionMeta(msgspec.Struct, frozen=True, rename="camel"):
    key: str
    memory_in_mb: int
    init_duration_in_ms: int
    runtime: str = ""
    timeout_in_secs: int = 0


class DatasetError(ValueError):
    """Bad dataset input, said with its file and line."""


_decoder = msgspec.json.Decoder(FunctionMeta)


def metas_path(path: str | Path) -> Path:
    """Accept a dataset folder or the metas file itself."""
    path = Path(path)
    return path / "metas" if path.is_dir() else path


def json_lines(path: Path, decoder: msgspec.json.Decoder[T]) -> Iterator[tuple[int, T]]:
    """Each non-blank line of a JSON-lines file, decoded, with its number; errors name file and line."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read: {e.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, decoder.decode(line)
        except msgspec.DecodeError as e:
            raise DatasetError(f"{path}:{n}: {e}") from None


def load_metas(path: str | Path) -> dict[str, FunctionMeta]:
    path = metas_path(path)
    metas: dict[str, FunctionMeta] = {}
    for n, meta in json_lines(path, _decoder):
        if meta.memory_in_mb <= 0:
            raise DatasetError(f"{path}:{n}: memoryInMb must be positive")
        metas[meta.key] = meta
    return metas
