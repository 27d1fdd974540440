"""The contracts: generated code is fresh, events and commands survive the wire, subjects stay safe."""

import typing

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaler.proto import commands, events
from scaler.proto.__main__ import stale
from scaler.proto.subjects import key_from_token, key_problem, key_token


def test_generated_code_matches_the_proto_files():
    assert stale() == [], "run `python -m scaler.proto` and commit the result"


def test_wire_names_of_the_challenge_are_kept():
    from scaler.proto import serverless_sim_pb2 as pb

    assert pb.DESCRIPTOR.package == "serverless.simulator"
    assert [m.name for m in pb.DESCRIPTOR.services_by_name["Scaler"].methods] == ["Assign", "Idle"]
    assert pb.AssignReply.DESCRIPTOR.fields_by_name["assigment"].number == 2
    assert pb.Meta.DESCRIPTOR.fields_by_name["memory_in_mb"].number == 5


# Every integer on our wire comes from a proto field or the clock: it fits msgpack's 64 bits.
st.register_type_strategy(int, st.integers(-(2**63), 2**64 - 1))

EVENT_TYPES = typing.get_args(events.AnyEvent)
COMMAND_TYPES = typing.get_args(commands.AnyCommand)


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda t: t.__name__)
@given(data=st.data())
def test_every_event_survives_a_batch_round_trip(kind, data):
    event = data.draw(st.builds(kind))
    batch = events.Batch(key=data.draw(st.text()), at_ms=1, cause="c", events=[event], wake_ms=None)
    assert events.decode_batch(events.encode_batch(batch)) == batch


@pytest.mark.parametrize("kind", COMMAND_TYPES, ids=lambda t: t.__name__)
@given(data=st.data())
def test_every_command_survives_the_wire(kind, data):
    cmd = data.draw(st.builds(kind))
    assert commands.decode_command(commands.encode(cmd)) == cmd


# Every event's stored tag. A stored stream holds these strings: a tag is never renamed or reused, a
# class may be renamed freely. Adding an event adds its tag here.
EVENT_TAGS = {
    "FunctionSeen": "function-seen",
    "RequestArrived": "request-arrived",
    "RequestRetried": "request-retried",
    "WaiterLeft": "waiter-left",
    "RequestWaiting": "request-waiting",
    "SlotWanted": "slot-wanted",
    "InstanceCreated": "instance-created",
    "InstanceReady": "instance-ready",
    "Assigned": "assigned",
    "Released": "released",
    "KeptAlive": "kept-alive",
    "RequestFailed": "request-failed",
    "RequestCancelled": "request-cancelled",
    "InstanceRetired": "instance-retired",
    "InstanceDestroyed": "instance-destroyed",
    "FunctionRested": "function-rested",
    "FunctionForgotten": "function-forgotten",
    "SessionBound": "session-bound",
    "SessionEnded": "session-ended",
    "FunctionRestarted": "function-restarted",
    "FunctionDeleted": "function-deleted",
    "Followed": "followed",
    "Cued": "cued",
    "InstanceToRetire": "instance-to-retire",
    "StateBound": "state-bound",
    "StateDeleted": "state-deleted",
    "LimitsSet": "limits-set",
    "PolicySet": "policy-set",
    "VersionSet": "version-set",
    "TenantSet": "tenant-set",
    "StartsHeld": "starts-held",
    "ClockRebased": "clock-rebased",
    "FunctionCreated": "function-created",
}


# Commands travel between processes of different versions during a rolling deploy: their tags stay too.
COMMAND_TAGS = {
    "Assign": "assign",
    "Idle": "idle",
    "Cancel": "cancel",
    "SlotCreated": "slot-created",
    "SlotReady": "slot-ready",
    "SlotFailed": "slot-failed",
    "SlotDestroyed": "slot-destroyed",
    "Tick": "tick",
    "Cue": "cue",
    "Reconcile": "reconcile",
    "Restart": "restart",
    "Delete": "delete",
    "Stop": "stop",
    "Configure": "configure",
    "Create": "create",
    "DeleteState": "delete-state",
}


@pytest.mark.parametrize(("types", "tags"), [(EVENT_TYPES, EVENT_TAGS), (COMMAND_TYPES, COMMAND_TAGS)])
def test_every_event_and_command_keeps_its_stored_tag(types, tags):
    assert {t.__name__: t.__struct_config__.tag for t in types} == tags
    assert len(set(tags.values())) == len(tags)


def test_a_batch_from_an_older_schema_is_upcast(monkeypatch):
    old = msgspec.msgpack.encode({"v": 0, "key": "fn", "at_ms": 5, "cause": "c", "evts": []})
    monkeypatch.setitem(events.UPCASTS, 0, lambda raw: {**raw, "events": raw.pop("evts")})
    batch = events.decode_batch(old)
    assert batch.v == events.SCHEMA_VERSION and batch.events == [] and batch.key == "fn"


def test_a_batch_from_a_newer_schema_is_refused_clearly():
    raw = {"v": events.SCHEMA_VERSION + 1, "key": "fn", "at_ms": 5, "cause": "c", "events": []}
    newer = msgspec.msgpack.encode(raw)
    with pytest.raises(events.SchemaError, match="reads up to"):
        events.decode_batch(newer)


def test_unknown_fields_from_a_newer_writer_are_ignored():
    raw = {"key": "fn", "at_ms": 5, "cause": "c", "events": [], "future_field": 1, "v": events.SCHEMA_VERSION}
    assert events.decode_batch(msgspec.msgpack.encode(raw)).key == "fn"


@given(st.text(min_size=1))
def test_key_tokens_are_one_safe_token_and_reversible(key):
    token = key_token(key)
    assert token and not any(c in token for c in ".*> \t\r\n")
    assert key_from_token(token) == key


def test_readable_keys_stay_readable():
    assert key_token("59604e0de19592edd848d362fe515f9d88458617") == "59604e0de19592edd848d362fe515f9d88458617"
    assert key_token("nodes1") == "nodes1"
    assert key_token("a.b") == "a%2Eb" and key_token("a%2Eb") == "a%252Eb"


@pytest.mark.parametrize("key", ["", "x" * 257, "a\x00b", "tab\there"])
def test_unacceptable_keys_have_a_reason(key):
    assert key_problem(key)
