"""The core must stay pure: no I/O, no clock, no randomness, no hidden state, so replay and simulation are exact.

Checked two ways. Statically, on every module's source: what it imports, which builtins it calls
(open, print, id, hash, ...), whether it keeps module-level state (an empty container at module
level, a `global` statement, a module-level name changed inside a function, a cache decorator).
Dynamically: decisions of every policy leave every core module's globals as they were.
"""

import ast
import copy
import importlib
import pkgutil
from pathlib import Path

import pytest

import scaler.controller.core
from scaler.controller.core.decide import decide
from scaler.controller.core.features import NO_STATS
from scaler.controller.core.policy import POLICIES, get_policy
from scaler.controller.core.state import FnState, Phase
from scaler.controller.core.totals import Totals
from scaler.proto import commands as c
from scaler.proto import events as e

CORE = Path(scaler.controller.core.__file__).parent

FORBIDDEN_MODULES = {
    *("asyncio", "threading", "multiprocessing", "concurrent", "subprocess", "signal"),  # concurrency, processes
    *("os", "io", "pathlib", "shutil", "tempfile", "sqlite3", "aiosqlite", "pickle", "shelve", "glob"),  # files
    *("socket", "ssl", "http", "urllib", "nats", "grpc"),  # network
    *("time", "datetime", "random", "uuid", "secrets"),  # clock and randomness
    *("logging", "warnings", "sys", "inspect", "importlib", "builtins", "gc", "ctypes"),  # the process itself
}
FORBIDDEN_CALLS = {
    *("open", "print", "input", "breakpoint"),  # I/O
    *("exec", "eval", "compile", "__import__", "globals", "setattr", "delattr"),  # code and namespaces
    "id",  # behaviour keyed on object identity (a cache of live objects)
    "hash",  # str hashes change from one process to the next
}
CACHE_DECORATORS = {"cache", "lru_cache", "cached_property"}
MUTATORS = {
    *("append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add", "discard"),
    *("remove", "sort", "reverse", "appendleft", "extendleft", "__setitem__", "__delitem__"),
}
EMPTY_CONTAINERS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "deque", "Counter"}


def offences(source: str) -> list[str]:
    """What in this module's source could do I/O or keep state across decisions, one line each."""
    tree = ast.parse(source)
    module_names = _module_names(tree)
    found = [f"line {n.lineno}: {what}" for n, what in _module_level(tree)]
    for node in ast.walk(tree):
        what = _offence(node, module_names)
        if what:
            found.append(f"line {node.lineno}: {what}")
    return found


def _module_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
    return names


def _module_level(tree: ast.Module):
    """Empty containers at module level: nothing but a function filling them in would need them."""
    for node in tree.body:
        value = getattr(node, "value", None) if isinstance(node, ast.Assign | ast.AnnAssign) else None
        empty_literal = isinstance(value, ast.Dict | ast.List | ast.Set) and not _elements(value)
        empty_call = isinstance(value, ast.Call) and _name(value.func) in EMPTY_CONTAINERS and not value.args
        if empty_literal or empty_call:
            yield node, "an empty container at module level (a cache?)"


def _elements(node: ast.AST) -> list:
    return node.keys if isinstance(node, ast.Dict) else node.elts


def _offence(node: ast.AST, module_names: set[str]) -> str | None:
    match node:
        case ast.Import(names=names):
            bad = {a.name.split(".")[0] for a in names} & FORBIDDEN_MODULES
            return f"imports {', '.join(sorted(bad))}" if bad else None
        case ast.ImportFrom(module=str(module), level=0) if module.split(".")[0] in FORBIDDEN_MODULES:
            return f"imports {module}"
        case ast.Call(func=ast.Name(id=name)) if name in FORBIDDEN_CALLS:
            return f"calls {name}()"
        case ast.Call(func=ast.Attribute(value=ast.Name(id=owner), attr=method)) if (
            owner in module_names and method in MUTATORS
        ):
            return f"changes module-level {owner} ({method})"
        case ast.Global(names=names):
            return f"global {', '.join(names)}"
        case ast.FunctionDef(decorator_list=decorators) if any(_name(d) in CACHE_DECORATORS for d in decorators):
            return f"caches {node.name}"
        case ast.Assign(targets=targets) | ast.Delete(targets=targets):
            return _store_into_module_name(targets, module_names)
        case ast.AugAssign(target=target):
            return _store_into_module_name([target], module_names)
    return None


def _store_into_module_name(targets: list[ast.AST], module_names: set[str]) -> str | None:
    for t in targets:
        if (
            isinstance(t, ast.Subscript | ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id in module_names
        ):
            return f"changes module-level {t.value.id}"
    return None


def _name(node: ast.AST) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def core_modules():
    yield scaler.controller.core
    for info in pkgutil.walk_packages(scaler.controller.core.__path__, "scaler.controller.core."):
        yield importlib.import_module(info.name)


def test_the_core_does_no_io_and_keeps_no_state_of_its_own():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 10
    found = {str(f.relative_to(CORE)): offences(f.read_text()) for f in files}
    assert {f: bad for f, bad in found.items() if bad} == {}


PLANTED = """\
import time
from nats.aio import client
import logging

log = logging.getLogger("core")
_MEMO = {}
_SEEN: list[int] = list()
POLICIES = {"demo": 1}  # a constant: fine


@functools.lru_cache
def cached(x):
    return x


def decide(s):
    global _LAST
    print(s)
    with open("/tmp/x") as f:
        f.read()
    _MEMO[id(s)] = s
    _SEEN.append(hash(s))
    POLICIES.update(more=2)
    _LAST = s
"""


def test_the_check_catches_each_kind_of_offender():
    assert set(offences(PLANTED)) == {
        "line 1: imports time",
        "line 2: imports nats.aio",
        "line 3: imports logging",
        "line 6: an empty container at module level (a cache?)",
        "line 7: an empty container at module level (a cache?)",
        "line 12: caches cached",
        "line 17: global _LAST",
        "line 18: calls print()",
        "line 19: calls open()",
        "line 21: changes module-level _MEMO",
        "line 21: calls id()",
        "line 22: changes module-level _SEEN (append)",
        "line 22: calls hash()",
        "line 23: changes module-level POLICIES (update)",
    }


def globals_of_the_core() -> dict[str, dict[str, object]]:
    """Every core module's globals: containers copied deeply, anything else by identity."""
    return {
        m.__name__: {
            name: copy.deepcopy(value) if isinstance(value, dict | list | set | bytearray) else id(value)
            for name, value in vars(m).items()
            if name != "__builtins__"
        }
        for m in core_modules()
    }


def busy_run(policy_name: str) -> None:
    """Decisions of one policy over a few functions, long enough for the learned policy to tune itself."""
    policy, totals, states, learned = get_policy(policy_name), Totals(), {}, {}

    def step(cmd: c.AnyCommand, now: int) -> FnState:
        nonlocal totals
        old, was = states.get(cmd.key), learned.get(cmd.key, NO_STATS)
        d = decide(old or FnState(key=cmd.key), cmd, now, policy, totals, features=was)
        totals = totals.change(old, d.state, was, d.features)
        states[cmd.key], learned[cmd.key] = d.state, d.features
        return d.state

    meta, now = e.Meta(memory_mb=256, timeout_s=60), 0
    for n in range(300):
        key, r = f"fn{n % 3}", f"r{n}"
        s = step(c.Assign(key=key, request_id=r, meta=meta, reply_to="to"), now)
        for inst in s.in_phase(Phase.CREATING):
            s = step(c.SlotReady(key=key, instance_id=inst.id, slot_id=f"slot-{inst.id}", create_ms=100), now + 100)
        for inst in s.in_phase(Phase.BUSY):
            step(c.Idle(key=key, request_id=inst.request_id, instance_id=inst.id), now + 250)
        now += 450 + (n % 11) * 900
        step(c.Tick(key=key, due_ms=now), now)
    assert sum(st.arrivals for st in learned.values()) == 300
    assert totals.exec_ms >= 30_000  # enough for the learned policy to tune itself to the run


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_decisions_leave_the_cores_globals_as_they_were(policy):
    before = globals_of_the_core()
    busy_run(policy)
    assert globals_of_the_core() == before


def test_the_run_check_catches_a_cache_filled_at_run_time(monkeypatch):
    """The cache this core once had: pool targets kept in a module-global dict keyed on id(stats)."""
    learned = importlib.import_module("scaler.controller.core.policy.learned")
    monkeypatch.setattr(learned, "_POOL_MEMO", {}, raising=False)
    compute = learned.Learned.pool_target

    def memoised(self, s, f, now, **kw):
        key = (id(f), now, self.config.wait_gb, *kw.items())
        return learned._POOL_MEMO.setdefault(key, compute(self, s, f, now, **kw))

    monkeypatch.setattr(learned.Learned, "pool_target", memoised)
    before = globals_of_the_core()
    busy_run("learned")
    assert globals_of_the_core() != before


def test_the_run_check_catches_a_global_assigned_at_run_time(monkeypatch):
    before = globals_of_the_core()
    monkeypatch.setattr(importlib.import_module("scaler.controller.core.decide"), "_LAST", None, raising=False)
    assert globals_of_the_core() != before


OUR_PARTS = {"scaler", "bench"}
THE_CORE_AND_PROTO = ("scaler.controller.core.", "scaler.proto.")


def test_the_core_tests_need_only_the_core_and_proto():
    """So they run first, alone and fast, and say something about the core alone."""
    outside = {}
    for f in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in OUR_PARTS and not (name + ".").startswith(THE_CORE_AND_PROTO):
                    outside.setdefault(f.name, []).append(name)
    assert outside == {}
