"""Where messages travel: the stream, its subjects, partitions, and how a metaKey becomes a subject token.

This is part of the contract between the components:
- Every function belongs to one of PARTITIONS partitions (a stable hash of its metaKey); one
  controller at a time owns a partition and is the only writer of its functions' events.
- Events: one batch per decision on `evt.<effects>.<partition>.<token>` in the stream EVENTS.
  `<effects>` says which workers the batch concerns: `c` asks for an instance to be created
  (SlotWanted), `d` for a slot to be destroyed (InstanceRetired with a slot), `cd` both, `n`
  neither. A worker's consumer filters on its letters, so a warm Assign reaches no worker. The
  per-function order check spans all four subjects (`function_events`).
- Commands: core NATS requests on `cmd.<partition>`, answered by the partition's owner once the
  command's batch is stored (gateways and nodes passing calls and an operator's commands on).
- Reports: the workers' (what the platform did) on `report.<partition>`, answered the same way. A subject
  of their own, where the owner takes reports only, so that NATS can let a worker report without letting
  it send a call or an operator's command (deploy/nats.conf).
- Returns: a node tells the others on `returned` when one of its functions comes back from a lull
  (scaler/controller/returns.py): the functions that follow it may be on another node.
"""

import functools
import zlib

EVENTS = "EVENTS"  # the log: everything that happened, the source of all state
EVT = "evt"
CMD = "cmd"
REPORT = "report"
RETURNED = "returned"  # a function came back from a lull (scaler/controller/returns.py)
RECONCILE_ASK = "reconcile.ask"  # a node that took partitions over, or found events lost, asks the gc workers
UNLISTED = b"unlisted"  # a gc worker's answer to the ask when the platform cannot list its slots
PARTITIONS = 32  # fixed for a stream's life: partition numbers are part of its subjects

MAX_KEY_BYTES = 256
# The ids the core makes for instances are `<metaKey>-<n>` (FnState.next_instance_id): an Idle must be
# able to name any of them, whatever the key's length and however many instances it had.
MAX_INSTANCE_ID_BYTES = MAX_KEY_BYTES + 1 + 20

# What belongs to no function (a slot the platform has that no state knows) is kept under the
# empty key, which no function can have (key_problem refuses it), on a two-token subject, which
# no function's one-token subject can equal.
SYSTEM_KEY = ""
SYSTEM_TOKEN = "_sys.platform"
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def key_problem(key: str) -> str | None:
    """Why `key` is not an acceptable metaKey, or None when it is."""
    if not key:
        return "metaKey is empty"
    if len(key.encode()) > MAX_KEY_BYTES:
        return f"metaKey is longer than {MAX_KEY_BYTES} bytes"
    if any(not c.isprintable() for c in key):
        return "metaKey has a control or non-printable character"
    return None


def key_token(key: str) -> str:
    """A NATS subject token for `key`: the key itself when it is plainly safe, else %-escaped.

    Escaping every byte outside [A-Za-z0-9_-] (`.` `*` `>` spaces and `%` itself) keeps
    subjects to one token per key, keeps the mapping one-to-one, and leaves the usual
    hex or name keys readable in `nats stream view`.
    """
    if key == SYSTEM_KEY:
        return SYSTEM_TOKEN
    if all(c in _SAFE for c in key):
        return key
    return "".join(chr(b) if chr(b) in _SAFE else f"%{b:02X}" for b in key.encode())


def key_from_token(token: str) -> str:
    """The metaKey behind a subject token (the inverse of key_token)."""
    if token == SYSTEM_TOKEN:
        return SYSTEM_KEY
    if "%" not in token:
        return token
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "%":
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(token[i]))
            i += 1
    return out.decode()


@functools.lru_cache(maxsize=1 << 16)
def partition(key: str) -> int:
    """The partition a function belongs to: stable across processes, machines and versions. Asked a dozen times a
    call on the command path, so remembered for the functions seen lately."""
    return zlib.crc32(key.encode()) % PARTITIONS


def command_subject(key: str) -> str:
    """Where a command about `key` is sent: its partition's owner answers."""
    return f"{CMD}.{partition(key)}"


def report_subject(key: str) -> str:
    """Where a worker's report about `key` is sent: its partition's owner answers."""
    return f"{REPORT}.{partition(key)}"


NO_EFFECTS = "n"


def effects_token(create: bool, destroy: bool) -> str:
    """The `<effects>` token of a batch's subject: `c`, `d`, `cd` or `n`."""
    return ("c" if create else "") + ("d" if destroy else "") or NO_EFFECTS


def event_subject(key: str, effects: str = NO_EFFECTS) -> str:
    return f"{EVT}.{effects}.{partition(key)}.{key_token(key)}"


def function_events(key: str) -> str:
    """Every batch of one function, whatever its effects: the subject its order check and catch-up read."""
    return f"{EVT}.*.{partition(key)}.{key_token(key)}"


def partition_events(p: int) -> str:
    """Every batch of one partition's functions."""
    return f"{EVT}.*.{p}.>"


def worker_subjects(letter: str) -> list[str]:
    """The subjects of the batches a worker acts on: those whose effects include `letter` (c or d)."""
    return [f"{EVT}.{e}.>" for e in ("c", "d", "cd") if letter in e]
