"""A dataset in the challenge's format: a folder with `metas` and `requests`, JSON lines each."""

from dataclasses import dataclass
from pathlib import Path

import msgspec

from platform_stub.metas import DatasetError, FunctionMeta, load_metas


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


_decoder = msgspec.json.Decoder(Request)


def load_dataset(folder: str | Path) -> Dataset:
    """Read and check a dataset; every problem is a DatasetError naming the file and line."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(f"{folder}: not a dataset folder (expected `metas` and `requests` inside)")
    metas = load_metas(folder / "metas")
    path = folder / "requests"
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read: {e.strerror}") from None
    requests = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            request = _decoder.decode(line)
        except msgspec.DecodeError as e:
            raise DatasetError(f"{path}:{n}: {e}") from None
        if request.meta_key not in metas:
            raise DatasetError(f"{path}:{n}: metaKey {request.meta_key!r} has no entry in {folder / 'metas'}")
        if request.durations_in_ms < 0:
            raise DatasetError(f"{path}:{n}: durationsInMs is negative")
        requests.append(request)
    if not requests:
        raise DatasetError(f"{path}: no requests")
    requests.sort(key=lambda r: r.start_time)  # stable: ties keep file order
    return Dataset(folder.name, metas, requests)
