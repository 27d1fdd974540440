"""Files an operator replaces while a process runs (certificates, CAs, the admin key): looked at every POLL_S and at
SIGHUP; what is made of them is made again when one changed, said in one line, and used from then on.

A change is a change of content (the files are small, and read each time), so a file rewritten in place, moved
over, or swapped behind a symlink (a Kubernetes secret) is seen alike. What cannot be made of the new content (a
certificate whose key is not written yet, a file half-written) is said once and the old kept, until the files
change again: a rotation never leaves a listener or a client with nothing it can use.
"""

import asyncio
import hashlib
import logging
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger("scaler.reload")

T = TypeVar("T")
POLL_S = 1.0


class Watched(Generic[T]):
    """What `make` makes of `paths` (`value`), made again when their content changes. `what` names it in the log
    line; `make` raises (ValueError, OSError) what cannot be used, at start as at a reload."""

    def __init__(self, what: str, paths: Sequence[str], make: Callable[[], T]) -> None:
        self.what = what
        self.paths = tuple(p for p in paths if p)
        self.make = make
        self._seen = self._content()
        self.value = make()
        self.generation = 0  # how many times it was made again
        self._users: list[tuple[Callable[[T], None], Callable[[], bool]]] = []
        self.abandoned = False  # it had users, and every one is gone: no more looked at
        self._refused = b""  # the content last refused, said once

    def current(self) -> T:
        """The value as it is now (for whoever asks at each use rather than being told of a change)."""
        return self.value

    def use(self, user: Callable[[T], None], alive: Callable[[], bool]) -> None:
        """Call `user(value)` at each change from now on, for as long as `alive()`: the files are looked at (`watch`)
        while it has a user alive."""
        self._users.append((user, alive))
        self.abandoned = False
        watch(self)

    def in_use(self) -> bool:
        """Whether anyone still uses it: one with users has none left alive, or is used by whoever holds it (a
        listener, Admin). One no more in use is no more looked at."""
        if self._users:
            self._users = [(user, alive) for user, alive in self._users if alive()]
            self.abandoned = not self._users
        if self.abandoned:
            _watched.discard(self)
        return not self.abandoned

    def look(self) -> bool:
        """Make it again if a file changed; whether it was."""
        content = self._content()
        if content == self._seen:
            return False
        try:
            value = self.make()
        except (ValueError, OSError) as e:
            if content != self._refused:
                log.warning("%s changed, but cannot be used (%s): still using the one before", self.what, e)
                self._refused = content
            return False
        self._seen, self.value, self._refused = content, value, b""
        self.generation += 1
        log.info("reloaded %s (%s)", self.what, ", ".join(self.paths))
        for user, alive in self._users:
            if alive():
                self._tell(user, value)
        return True

    def _tell(self, user: Callable[[T], None], value: T) -> None:
        try:
            user(value)
        except Exception:
            log.exception("%s: reloaded, but one of its users failed to take it", self.what)

    def fetcher(self) -> Callable[[], T | None]:
        """A function that returns the value once after each change, else None: gRPC's certificate fetcher, which
        its server calls at each new connection, on one of its own threads."""
        given = self.generation

        def fetch() -> T | None:
            nonlocal given
            if self.generation == given:
                return None
            given = self.generation
            return self.value

        return fetch

    def _content(self) -> bytes:
        digest = hashlib.sha256()
        for path in self.paths:
            try:
                data = Path(path).read_bytes()
            except OSError as e:  # moved away for a moment: a change, which `make` will say if it lasts
                data = f"unreadable: {e.errno}".encode()
            digest.update(len(data).to_bytes(8, "big") + data)
        return digest.digest()


_watched: "weakref.WeakSet[Watched]" = weakref.WeakSet()
_poll: asyncio.Task | None = None


def watch(watched: Watched[T]) -> Watched[T]:
    """Look at `watched` every POLL_S from now on, for as long as it is in use; returned as given."""
    global _poll
    _watched.add(watched)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop yet: looked at when one runs another watch, or at SIGHUP
        return watched
    if _poll is None or _poll.done() or _poll.get_loop() is not loop:
        _poll = loop.create_task(_polling(), name="reload")
    return watched


def look() -> int:
    """Look at every watched file in use now; how many things were made again."""
    return sum(w.look() for w in list(_watched) if w.in_use())


def hangup() -> None:
    """SIGHUP: look now, and say so in one line when nothing changed."""
    if not look():
        log.info("SIGHUP: no certificate, CA or key changed (%d watched)", len(_watched))


async def _polling() -> None:
    while _watched:
        await asyncio.sleep(POLL_S)
        try:
            look()
        except Exception:  # a bug in one `make` must not end the watch of the others
            log.exception("looking for changed certificates and keys failed")
