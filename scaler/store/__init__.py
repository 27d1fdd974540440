"""The event store: EVENTS on JetStream (`EventStore`), its configuration and its errors."""

from scaler.runtime.bus import Unavailable
from scaler.store.config import DEFAULT_RETENTION, Retention, StoreTooSmall
from scaler.store.eventstore import EventStore
from scaler.store.stream import ALL, Append, Conflict, Kept, NotSent, TooBig, UnreadableStream

__all__ = [
    "ALL",
    "DEFAULT_RETENTION",
    "Append",
    "Conflict",
    "EventStore",
    "Kept",
    "NotSent",
    "Retention",
    "StoreTooSmall",
    "TooBig",
    "Unavailable",
    "UnreadableStream",
]
