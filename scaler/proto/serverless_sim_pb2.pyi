from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Ok: _ClassVar[Status]
    Throttle: _ClassVar[Status]
    InternalError: _ClassVar[Status]
    NotFound: _ClassVar[Status]
    InvalidArgument: _ClassVar[Status]
    InvalidAssigment: _ClassVar[Status]
Ok: Status
Throttle: Status
InternalError: Status
NotFound: Status
InvalidArgument: Status
InvalidAssigment: Status

class AssignRequest(_message.Message):
    __slots__ = ("request_id", "timestamp", "meta_data")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    META_DATA_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    timestamp: int
    meta_data: Meta
    def __init__(self, request_id: _Optional[str] = ..., timestamp: _Optional[int] = ..., meta_data: _Optional[_Union[Meta, _Mapping]] = ...) -> None: ...

class AssignReply(_message.Message):
    __slots__ = ("status", "assigment", "error_message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ASSIGMENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    assigment: Assignment
    error_message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., assigment: _Optional[_Union[Assignment, _Mapping]] = ..., error_message: _Optional[str] = ...) -> None: ...

class IdleRequest(_message.Message):
    __slots__ = ("assigment", "result")
    ASSIGMENT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    assigment: Assignment
    result: Result
    def __init__(self, assigment: _Optional[_Union[Assignment, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ...) -> None: ...

class IdleReply(_message.Message):
    __slots__ = ("status", "error_message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    error_message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class Meta(_message.Message):
    __slots__ = ("key", "runtime", "timeout_in_secs", "memory_in_mb")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_IN_SECS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IN_MB_FIELD_NUMBER: _ClassVar[int]
    key: str
    runtime: str
    timeout_in_secs: int
    memory_in_mb: int
    def __init__(self, key: _Optional[str] = ..., runtime: _Optional[str] = ..., timeout_in_secs: _Optional[int] = ..., memory_in_mb: _Optional[int] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("request_id", "meta_key", "instance_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    META_KEY_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    meta_key: str
    instance_id: str
    def __init__(self, request_id: _Optional[str] = ..., meta_key: _Optional[str] = ..., instance_id: _Optional[str] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("status_code", "duration_in_ms", "need_destroy", "reason")
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DURATION_IN_MS_FIELD_NUMBER: _ClassVar[int]
    NEED_DESTROY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status_code: int
    duration_in_ms: int
    need_destroy: bool
    reason: str
    def __init__(self, status_code: _Optional[int] = ..., duration_in_ms: _Optional[int] = ..., need_destroy: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class CreateSlotRequest(_message.Message):
    __slots__ = ("request_id", "resource_config")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    resource_config: ResourceConfig
    def __init__(self, request_id: _Optional[str] = ..., resource_config: _Optional[_Union[ResourceConfig, _Mapping]] = ...) -> None: ...

class CreateSlotReply(_message.Message):
    __slots__ = ("status", "slot", "error_message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    slot: Slot
    error_message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., slot: _Optional[_Union[Slot, _Mapping]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DestroySlotRequest(_message.Message):
    __slots__ = ("request_id", "id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    id: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DestroySlotReply(_message.Message):
    __slots__ = ("status", "error_message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    error_message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class Slot(_message.Message):
    __slots__ = ("id", "resource_config", "create_time", "create_duration_in_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_DURATION_IN_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    resource_config: ResourceConfig
    create_time: int
    create_duration_in_ms: int
    def __init__(self, id: _Optional[str] = ..., resource_config: _Optional[_Union[ResourceConfig, _Mapping]] = ..., create_time: _Optional[int] = ..., create_duration_in_ms: _Optional[int] = ...) -> None: ...

class InitRequest(_message.Message):
    __slots__ = ("request_id", "slot_id", "instance_id", "meta_data")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    META_DATA_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    slot_id: str
    instance_id: str
    meta_data: Meta
    def __init__(self, request_id: _Optional[str] = ..., slot_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., meta_data: _Optional[_Union[Meta, _Mapping]] = ...) -> None: ...

class InitReply(_message.Message):
    __slots__ = ("status", "create_time", "init_duration_in_ms", "error_message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    INIT_DURATION_IN_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    create_time: int
    init_duration_in_ms: int
    error_message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., create_time: _Optional[int] = ..., init_duration_in_ms: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class ResourceConfig(_message.Message):
    __slots__ = ("memory_in_megabytes",)
    MEMORY_IN_MEGABYTES_FIELD_NUMBER: _ClassVar[int]
    memory_in_megabytes: int
    def __init__(self, memory_in_megabytes: _Optional[int] = ...) -> None: ...
