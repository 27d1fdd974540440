"""Who runs on which instance, as the platform sees it; both simulator modes check assignments here.

An Assign must name an instance that runs on a live slot, has finished its Init and runs no
other request; a request that got one runs on it until its Idle, and fails if the slot is
destroyed meanwhile (no execution happens without a slot).
"""

from scaler.simulator.score import Failure


class Holds:
    def __init__(self) -> None:
        self._holder: dict[str, str] = {}  # instance -> the request running on it

    def assign(self, instance: str, request: str, *, live: bool, ready: bool) -> Failure | None:
        """The scaler answered `request` with `instance`: None when the request now runs on it, else why not."""
        if not live:
            return Failure.UNKNOWN_INSTANCE
        if not ready:
            return Failure.NOT_INITIALISED
        if self._holder.get(instance, request) != request:
            return Failure.HELD
        self._holder[instance] = request
        return None

    def finish(self, instance: str, request: str, *, live: bool) -> Failure | None:
        """`request`'s execution on `instance` ended; `live`: its slot still exists."""
        if self._holder.get(instance) == request:
            del self._holder[instance]
        return None if live else Failure.SLOT_LOST
