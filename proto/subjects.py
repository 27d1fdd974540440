"""Where messages travel: stream names, subjects, and how a metaKey becomes a subject token.

This is part of the contract between the components: the gateway and the workers publish
commands on `cmd.<token>`, the controller alone appends events on `evt.<token>`.
"""

COMMANDS = "COMMANDS"  # work-queue stream: what the controller must handle
EVENTS = "EVENTS"  # the log: everything that happened, the source of all state
CMD = "cmd"
EVT = "evt"

MAX_KEY_BYTES = 256

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


def command_subject(key: str) -> str:
    return f"{CMD}.{key_token(key)}"


def event_subject(key: str) -> str:
    return f"{EVT}.{key_token(key)}"
