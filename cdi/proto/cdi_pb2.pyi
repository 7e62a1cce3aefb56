from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContainerRecord(_message.Message):
    __slots__ = ("container_id", "pid", "uid", "registered_at")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    pid: int
    uid: int
    registered_at: float
    def __init__(self, container_id: _Optional[str] = ..., pid: _Optional[int] = ..., uid: _Optional[int] = ..., registered_at: _Optional[float] = ...) -> None: ...

class ObjectRecord(_message.Message):
    __slots__ = ("key", "size", "owner", "generation", "created_at", "updated_at")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    key: str
    size: int
    owner: str
    generation: int
    created_at: float
    updated_at: float
    def __init__(self, key: _Optional[str] = ..., size: _Optional[int] = ..., owner: _Optional[str] = ..., generation: _Optional[int] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ...) -> None: ...

class RegisterMinionRequest(_message.Message):
    __slots__ = ("host", "socket_path", "rpc_address", "heartbeat_s", "containers", "objects", "keeps_objects", "restarts", "kept_objects")
    HOST_FIELD_NUMBER: _ClassVar[int]
    SOCKET_PATH_FIELD_NUMBER: _ClassVar[int]
    RPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    KEEPS_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    KEPT_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    host: str
    socket_path: str
    rpc_address: str
    heartbeat_s: float
    containers: _containers.RepeatedCompositeFieldContainer[ContainerRecord]
    objects: _containers.RepeatedCompositeFieldContainer[ObjectRecord]
    keeps_objects: bool
    restarts: int
    kept_objects: int
    def __init__(self, host: _Optional[str] = ..., socket_path: _Optional[str] = ..., rpc_address: _Optional[str] = ..., heartbeat_s: _Optional[float] = ..., containers: _Optional[_Iterable[_Union[ContainerRecord, _Mapping]]] = ..., objects: _Optional[_Iterable[_Union[ObjectRecord, _Mapping]]] = ..., keeps_objects: _Optional[bool] = ..., restarts: _Optional[int] = ..., kept_objects: _Optional[int] = ...) -> None: ...

class RegisterMinionResponse(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    def __init__(self, epoch: _Optional[str] = ...) -> None: ...

class ReportChangesRequest(_message.Message):
    __slots__ = ("host", "epoch", "upsert_containers", "removed_containers", "upsert_objects", "removed_objects")
    HOST_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPSERT_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    UPSERT_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    host: str
    epoch: str
    upsert_containers: _containers.RepeatedCompositeFieldContainer[ContainerRecord]
    removed_containers: _containers.RepeatedScalarFieldContainer[str]
    upsert_objects: _containers.RepeatedCompositeFieldContainer[ObjectRecord]
    removed_objects: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host: _Optional[str] = ..., epoch: _Optional[str] = ..., upsert_containers: _Optional[_Iterable[_Union[ContainerRecord, _Mapping]]] = ..., removed_containers: _Optional[_Iterable[str]] = ..., upsert_objects: _Optional[_Iterable[_Union[ObjectRecord, _Mapping]]] = ..., removed_objects: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportChangesResponse(_message.Message):
    __slots__ = ("resync_required", "epoch")
    RESYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    resync_required: bool
    epoch: str
    def __init__(self, resync_required: _Optional[bool] = ..., epoch: _Optional[str] = ...) -> None: ...

class ContainerInfo(_message.Message):
    __slots__ = ("container_id", "host", "pid", "uid", "registered_at")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    host: str
    pid: int
    uid: int
    registered_at: float
    def __init__(self, container_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., uid: _Optional[int] = ..., registered_at: _Optional[float] = ...) -> None: ...

class ObjectInfo(_message.Message):
    __slots__ = ("key", "host", "size", "owner", "generation", "created_at", "updated_at")
    KEY_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    key: str
    host: str
    size: int
    owner: str
    generation: int
    created_at: float
    updated_at: float
    def __init__(self, key: _Optional[str] = ..., host: _Optional[str] = ..., size: _Optional[int] = ..., owner: _Optional[str] = ..., generation: _Optional[int] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ...) -> None: ...

class Route(_message.Message):
    __slots__ = ("container_id", "host", "rpc_address", "alive")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    RPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    host: str
    rpc_address: str
    alive: bool
    def __init__(self, container_id: _Optional[str] = ..., host: _Optional[str] = ..., rpc_address: _Optional[str] = ..., alive: _Optional[bool] = ...) -> None: ...

class MinionInfo(_message.Message):
    __slots__ = ("host", "socket_path", "rpc_address", "registered_at", "last_heartbeat", "heartbeat_s", "alive", "containers", "objects", "keeps_objects", "restarts", "kept_objects")
    HOST_FIELD_NUMBER: _ClassVar[int]
    SOCKET_PATH_FIELD_NUMBER: _ClassVar[int]
    RPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    KEEPS_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    KEPT_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    host: str
    socket_path: str
    rpc_address: str
    registered_at: float
    last_heartbeat: float
    heartbeat_s: float
    alive: bool
    containers: int
    objects: int
    keeps_objects: bool
    restarts: int
    kept_objects: int
    def __init__(self, host: _Optional[str] = ..., socket_path: _Optional[str] = ..., rpc_address: _Optional[str] = ..., registered_at: _Optional[float] = ..., last_heartbeat: _Optional[float] = ..., heartbeat_s: _Optional[float] = ..., alive: _Optional[bool] = ..., containers: _Optional[int] = ..., objects: _Optional[int] = ..., keeps_objects: _Optional[bool] = ..., restarts: _Optional[int] = ..., kept_objects: _Optional[int] = ...) -> None: ...

class LookupContainerRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class ListContainersRequest(_message.Message):
    __slots__ = ("host",)
    HOST_FIELD_NUMBER: _ClassVar[int]
    host: str
    def __init__(self, host: _Optional[str] = ...) -> None: ...

class ListContainersResponse(_message.Message):
    __slots__ = ("containers",)
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    containers: _containers.RepeatedCompositeFieldContainer[ContainerInfo]
    def __init__(self, containers: _Optional[_Iterable[_Union[ContainerInfo, _Mapping]]] = ...) -> None: ...

class LookupObjectRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ListObjectsRequest(_message.Message):
    __slots__ = ("owner", "host")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    owner: str
    host: str
    def __init__(self, owner: _Optional[str] = ..., host: _Optional[str] = ...) -> None: ...

class ListObjectsResponse(_message.Message):
    __slots__ = ("objects",)
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[ObjectInfo]
    def __init__(self, objects: _Optional[_Iterable[_Union[ObjectInfo, _Mapping]]] = ...) -> None: ...

class ListMinionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListMinionsResponse(_message.Message):
    __slots__ = ("minions", "epoch")
    MINIONS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    minions: _containers.RepeatedCompositeFieldContainer[MinionInfo]
    epoch: str
    def __init__(self, minions: _Optional[_Iterable[_Union[MinionInfo, _Mapping]]] = ..., epoch: _Optional[str] = ...) -> None: ...
