"""CSV files of the public traces, read by their published column names."""

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from scaler.traces.build import TraceError


@dataclass
class Table:
    """A CSV file's header and its rows; columns are looked up by the names the trace publishes."""

    path: Path
    header: list[str]

    def column(self, name: str) -> int:
        try:
            return self.header.index(name)
        except ValueError:
            raise TraceError(f"{self.path}: no column {name!r} (its columns: {', '.join(self.header[:12])})") from None

    def rows(self) -> Iterator[tuple[int, list[str]]]:
        """(line number, cells) of every data row; a row of another length than the header is an error."""
        try:
            with self.path.open(newline="") as f:
                reader = csv.reader(f)
                next(reader, None)
                for row in reader:
                    if not row:
                        continue
                    if len(row) != len(self.header):
                        line = reader.line_num
                        raise TraceError(f"{self.path}:{line}: {len(row)} cells, the header has {len(self.header)}")
                    yield reader.line_num, row
        except OSError as e:
            raise TraceError(f"{self.path}: cannot read: {e.strerror}") from None


def header(path: Path) -> list[str]:
    """A CSV file's column names (its first line only: the traces' files run to gigabytes)."""
    try:
        with path.open(newline="", errors="replace") as f:
            names = next(csv.reader(f), None)
    except (OSError, csv.Error) as e:
        raise TraceError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if not names:
        raise TraceError(f"{path}: empty: expected a header line")
    return [h.strip().lstrip("\ufeff") for h in names]


def table(path: Path, *required: str) -> Table:
    """Open a CSV file and check it has the columns `required`, as published."""
    t = Table(path, header(path))
    for name in required:
        t.column(name)
    return t


def number(t: Table, line: int, text: str, what: str) -> float:
    """A cell as a number; an empty cell (pandas' NaN) is 0."""
    if not text.strip() or text.strip().lower() == "nan":
        return 0.0
    try:
        return float(text)
    except ValueError:
        raise TraceError(f"{t.path}:{line}: {what} is not a number: {text!r}") from None
