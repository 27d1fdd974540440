from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("live_slots", "slots_created", "slots_destroyed", "inits", "slot_gb_seconds", "live_memory_mb")
    LIVE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_CREATED_FIELD_NUMBER: _ClassVar[int]
    SLOTS_DESTROYED_FIELD_NUMBER: _ClassVar[int]
    INITS_FIELD_NUMBER: _ClassVar[int]
    SLOT_GB_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIVE_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    live_slots: int
    slots_created: int
    slots_destroyed: int
    inits: int
    slot_gb_seconds: float
    live_memory_mb: int
    def __init__(self, live_slots: _Optional[int] = ..., slots_created: _Optional[int] = ..., slots_destroyed: _Optional[int] = ..., inits: _Optional[int] = ..., slot_gb_seconds: _Optional[float] = ..., live_memory_mb: _Optional[int] = ...) -> None: ...

class ListSlotsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlotInfo(_message.Message):
    __slots__ = ("id", "memory_in_mb", "instance_id", "create_time", "request_id", "ready")
    ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IN_MB_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    id: str
    memory_in_mb: int
    instance_id: str
    create_time: int
    request_id: str
    ready: bool
    def __init__(self, id: _Optional[str] = ..., memory_in_mb: _Optional[int] = ..., instance_id: _Optional[str] = ..., create_time: _Optional[int] = ..., request_id: _Optional[str] = ..., ready: _Optional[bool] = ...) -> None: ...

class ListSlotsReply(_message.Message):
    __slots__ = ("slots",)
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[SlotInfo]
    def __init__(self, slots: _Optional[_Iterable[_Union[SlotInfo, _Mapping]]] = ...) -> None: ...
