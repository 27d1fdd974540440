"""A dataset in the challenge's format: a folder with `metas` and `requests`, JSON lines each."""

from dataclasses import dataclass
from pathlib import Path

import msgspec

from platform_stub.metas import DatasetError, FunctionMeta, json_lines, load_metas


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
    requests = []
    for n, request in json_lines(path, _decoder):
        if request.meta_key not in metas:
            raise DatasetError(f"{path}:{n}: metaKey {request.meta_key!r} has no entry in {folder / 'metas'}")
        if request.durations_in_ms < 0:
            raise DatasetError(f"{path}:{n}: durationsInMs is negative")
        requests.append(request)
    if not requests:
        raise DatasetError(f"{path}: no requests")
    requests.sort(key=lambda r: r.start_time)  # stable: ties keep file order
    return Dataset(folder.name, metas, requests)
