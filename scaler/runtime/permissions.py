"""Whether NATS lets a component do what it must, asked at its start: a permission missing is one line naming
it, not a JetStream request that times out later for no reason given.

Each need is tried on a connection of its own, without effect: a publish to a stream's subjects carries
`Nats-Expected-Stream` naming no stream, so JetStream stores nothing; a JetStream API request goes with no
body and no reply subject, so one that needs a body (a create, an update) is refused and answered to nobody;
a publish elsewhere goes to a subject no one listens on; a subscription is dropped at once. A request whose
subject says it all (a delete, a purge, a leader's step-down) is done with no body and no reply as well, so
it cannot be tried: `publish` refuses to make such a need (a worker's preflight that tried the delete of its
durable consumer deleted it, and the effects it had not acked were sent again as new ones).

NATS says a refusal (a permissions violation) on the connection, mostly before it answers the flush that
follows, but not always (a node given a worker's permissions was told none of its 17 refusals by then, 4 runs
in 14): so it flushes again until a flush brings no more.
"""

import asyncio
import logging
from dataclasses import dataclass
from enum import Enum

import nats
import nats.errors

from scaler.runtime.access import Nats, access
from scaler.runtime.bus import Refused, refusal

log = logging.getLogger("scaler.permissions")

PROBE = "scaler-permission-probe"  # in every probe's subject or header: no stream or subscriber has this name
NO_STREAM = {"Nats-Expected-Stream": PROBE}
VIOLATION = "permissions violation"
ASK_S = 5.0


class Verb(Enum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"


@dataclass(frozen=True)
class Need:
    verb: Verb
    subject: str
    why: str  # what the component does with it, for the line that says it may not
    stored: bool = False  # the subject is a stream's: the publish carries NO_STREAM


ACTS_BARE = {"DELETE", "PURGE", "STEPDOWN", "REMOVE"}  # JetStream API requests done with no body


def publish(subject: str, why: str, stored: bool = False) -> Need:
    if subject.startswith("$JS.API.") and ACTS_BARE & set(subject.split(".")):
        raise ValueError(f"{subject} cannot be tried without effect: JetStream does it, body or not")
    return Need(Verb.PUBLISH, subject, why, stored)


def subscribe(subject: str, why: str) -> Need:
    return Need(Verb.SUBSCRIBE, subject, why)


class NotPermitted(RuntimeError):
    """NATS refuses a component something it must do."""


async def refused(nats_access: Nats, needs: list[Need]) -> list[Need]:
    """The needs NATS refuses this client, tried without effect."""
    where = access(nats_access)
    violations: list[str] = []
    connected = False

    async def on_error(e: Exception) -> None:
        if VIOLATION in str(e).lower():
            violations.append(str(e).lower())
        elif not connected and (why := refusal(e)):  # once connected, a TLS error is the close's: not ours to say
            raise Refused(f"NATS at {where} {why}")

    nc = await nats.connect(
        where.servers, error_cb=on_error, allow_reconnect=False, connect_timeout=ASK_S, **where.options()
    )
    connected = True
    try:
        for need in needs:
            if need.verb is Verb.PUBLISH:
                await nc.publish(need.subject, b"", headers=NO_STREAM if need.stored else None)
            else:
                await (await nc.subscribe(need.subject)).unsubscribe()
        await nc.flush(timeout=ASK_S)
        while True:  # a refusal may come after the flush's answer: until a flush brings none more
            seen = len(violations)
            await nc.flush(timeout=ASK_S)
            if len(violations) == seen:
                break
    finally:
        await nc.close()
    return [n for n in needs if any(_names(v, n) for v in violations)]


def _names(violation: str, need: Need) -> bool:
    """Whether a violation (`nats: permissions violation for publish to "x"`) is about `need`."""
    verb = "publish" if need.verb is Verb.PUBLISH else "subscription"
    return verb in violation and f'"{need.subject.lower()}"' in violation


class Preflight:
    """A component's first part: refuses to start, saying what is missing, when NATS does not permit `needs`."""

    def __init__(self, nats_access: Nats, who: str, needs: list[Need]) -> None:
        self.nats = nats_access
        self.who = who
        self.needs = needs

    async def start(self) -> str:
        try:
            async with asyncio.timeout(ASK_S * 2):
                missing = await refused(self.nats, self.needs)
        except (TimeoutError, OSError, nats.errors.Error) as e:  # not there yet: the component's own start waits
            log.info("%s: NATS permissions not checked (%s)", self.who, str(e) or type(e).__name__)
            return "permissions not checked"
        if missing:
            said = "; ".join(f"{n.verb.value} to {n.subject} ({n.why})" for n in missing)
            raise NotPermitted(
                f"NATS at {self.nats} does not permit the {self.who} to {said} (docs/operations.md: NATS permissions)"
            )
        return f"NATS permissions of the {self.who}: all given"

    async def stop(self) -> None:
        pass
