"""A dataset in the challenge's format: a folder with `metas` and `requests`, JSON lines each.

`metas` has one function per line (the platform stub reads only this file, for init times);
`requests` one request per line, sorted by start time.
"""

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
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


_meta_decoder = msgspec.json.Decoder(FunctionMeta)


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
    for n, meta in json_lines(path, _meta_decoder):
        if meta.memory_in_mb <= 0:
            raise DatasetError(f"{path}:{n}: memoryInMb must be positive")
        metas[meta.key] = meta
    return metas


def metas_argument(text: str) -> str:
    """An argparse type: a dataset folder or its metas file, read and checked before anything starts."""
    try:
        load_metas(text)
    except DatasetError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


class Request(msgspec.Struct, frozen=True, rename="camel"):
    start_time: int  # epoch ms
    meta_key: str
    durations_in_ms: int
    status_code: int = 200


@dataclass(frozen=True)
class Dataset:
    name: str
    metas: dict[str, FunctionMeta]
    requests: list[Request]  # by start time

    @property
    def start_ms(self) -> int:
        return self.requests[0].start_time if self.requests else 0

    @property
    def span_ms(self) -> int:
        """From the first request's start to the last's."""
        return self.requests[-1].start_time - self.start_ms if self.requests else 0


_request_decoder = msgspec.json.Decoder(Request)


def load_dataset(folder: str | Path) -> Dataset:
    """Read and check a dataset; every problem is a DatasetError naming the file and line."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(f"{folder}: not a dataset folder (expected `metas` and `requests` inside)")
    metas = load_metas(folder / "metas")
    path = folder / "requests"
    requests = []
    for n, request in json_lines(path, _request_decoder):
        if request.meta_key not in metas:
            raise DatasetError(f"{path}:{n}: metaKey {request.meta_key!r} has no entry in {folder / 'metas'}")
        if request.durations_in_ms < 0:
            raise DatasetError(f"{path}:{n}: durationsInMs is negative")
        requests.append(request)
    if not requests:
        raise DatasetError(f"{path}: no requests")
    requests.sort(key=lambda r: r.start_time)  # stable: ties keep file order
    return Dataset(folder.name, metas, requests)
