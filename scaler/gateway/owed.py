"""The requests a gateway assigned whose Idle has not come back through it.

A node leaving after a drain still answers them (passing each on to the partition's new owner), so
that a request under way when the node was asked to stop returns its instance through the node
that assigned it, rather than finding the port closed. A request whose Idle went to another node
never comes back here: the oldest are forgotten past an age or a count, so the set stays small.
"""

import asyncio
import time
from collections import OrderedDict

FORGET_S = 600.0  # a request assigned this long ago is no longer waited for
MAX_OWED = 100_000  # past this many, the oldest are forgotten first


class Owed:
    def __init__(self, forget_s: float = FORGET_S, most: int = MAX_OWED) -> None:
        self.forget_s = forget_s
        self.most = most
        # request id -> when it was assigned (monotonic), oldest first; ordered by a linked list, so that the
        # oldest is found at once however many were removed (a dict's iteration steps over its removed entries)
        self._since: OrderedDict[str, float] = OrderedDict()
        self._returned = asyncio.Event()

    def __len__(self) -> int:
        return len(self._since)

    def assigned(self, request_id: str) -> None:
        now = time.monotonic()
        self._since.pop(request_id, None)  # assigned again (a repeat): its age starts over
        self._since[request_id] = now
        while self._since and (len(self._since) > self.most or next(iter(self._since.values())) < now - self.forget_s):
            self._since.popitem(last=False)

    def returned(self, request_id: str) -> None:
        if self._since.pop(request_id, None) is not None:
            self._returned.set()

    async def settled(self, patience_s: float) -> int:
        """Wait until every request assigned here has returned, or `patience_s` passed; how many have not."""
        try:
            async with asyncio.timeout(patience_s):
                while self._since:
                    self._returned.clear()
                    await self._returned.wait()
        except TimeoutError:
            pass
        return len(self._since)
