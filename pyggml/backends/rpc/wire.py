"""ggml's RPC wire format, protocol 7.0.0 (ggml-rpc.cpp of llama.cpp 0c1e570): packed little-endian C structs.

Request | cmd (u8) | size (u64) | payload |, response | size (u64) | payload |; HELLO (command 14) comes first.
A server answers a request it cannot serve by closing the connection.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from pyggml.core.errors import GGMLError

RPC_PROTO_MAJOR_VERSION = 7
RPC_PROTO_MINOR_VERSION = 0
RPC_PROTO_PATCH_VERSION = 0
RPC_CONN_CAPS_SIZE = 24
HASH_THRESHOLD = 10 * 1024 * 1024  # SET_TENSOR_HASH is tried for larger WEIGHTS data
GGML_RPC_MAX_SERVERS = 16

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
GGML_MAX_OP_PARAMS_WORDS = 16


class RpcError(GGMLError):
    """A malformed RPC message, or a peer that broke the protocol."""


class RpcConnectionError(RpcError, ConnectionError):
    """The connection to an RPC peer failed or was closed (the message names the endpoint)."""


class RpcVersionError(RpcError):
    """The peer speaks a protocol version this side refuses."""


class RpcCmd(IntEnum):
    ALLOC_BUFFER = 0
    GET_ALIGNMENT = 1
    GET_MAX_SIZE = 2
    BUFFER_GET_BASE = 3
    FREE_BUFFER = 4
    BUFFER_CLEAR = 5
    SET_TENSOR = 6
    SET_TENSOR_HASH = 7
    GET_TENSOR = 8
    COPY_TENSOR = 9
    GRAPH_COMPUTE = 10
    GET_DEVICE_MEMORY = 11
    INIT_TENSOR = 12
    GET_ALLOC_SIZE = 13
    HELLO = 14
    DEVICE_COUNT = 15
    GRAPH_RECOMPUTE = 16
    MEMSET_TENSOR = 17
    NONE = 18  # the client's local marker, never sent


RPC_CMD_COUNT = 19
assert RpcCmd.HELLO == 14


# id, type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10], view_src, view_offs, data, name[64], use_count
RPC_TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")
RPC_TENSOR_SIZE = 296
assert RPC_TENSOR.size == RPC_TENSOR_SIZE and RPC_TENSOR_SIZE % 8 == 0

U32_MAX = 2**32 - 1


@dataclass
class RpcTensor:
    """struct rpc_tensor; ids name tensors within one message, buffer and data are the server's addresses."""

    id: int = 0
    type: int = 0
    buffer: int = 0
    ne: tuple[int, ...] = (0, 0, 0, 0)
    nb: tuple[int, ...] = (0, 0, 0, 0)
    op: int = 0
    op_params: tuple[int, ...] = (0,) * GGML_MAX_OP_PARAMS_WORDS
    flags: int = 0
    src: tuple[int, ...] = (0,) * GGML_MAX_SRC
    view_src: int = 0
    view_offs: int = 0
    data: int = 0
    name: bytes = field(default=b"")
    use_count: int = 0

    def pack(self) -> bytes:
        return RPC_TENSOR.pack(self.id, self.type, self.buffer, *self.ne, *self.nb, self.op, *self.op_params,
                               self.flags, *self.src, self.view_src, self.view_offs, self.data,
                               _name_bytes(self.name), self.use_count)

    @staticmethod
    def unpack(data: bytes | memoryview, offset: int = 0) -> RpcTensor:
        v = RPC_TENSOR.unpack_from(data, offset)
        return RpcTensor(id=v[0], type=v[1], buffer=v[2], ne=v[3:7], nb=v[7:11], op=v[11], op_params=v[12:28],
                         flags=v[28], src=v[29:39], view_src=v[39], view_offs=v[40], data=v[41],
                         name=v[42].split(b"\0", 1)[0], use_count=v[43])

    @property
    def name_str(self) -> str:
        return self.name.decode("utf-8", "replace")


NULL_TENSOR = bytes(RPC_TENSOR_SIZE)


def _name_bytes(name: bytes) -> bytes:
    return name[: GGML_MAX_NAME - 1]


def pack_tensor(id: int, type: int, buffer: int, ne: list[int], nb: list[int], op: int, op_params: np.ndarray,
                flags: int, src: list[int], view_src: int, view_offs: int, data: int, name: str,
                use_count: int = 0) -> bytes:
    """serialize_tensor's rpc_tensor; ne and nb past u32 raise RpcError where C would wrap."""
    try:
        return RPC_TENSOR.pack(id, type, buffer, *ne, *nb, op, *op_params.tolist(), flags, *src, view_src,
                               view_offs, data, name.encode("utf-8")[: GGML_MAX_NAME - 1], use_count)
    except struct.error as e:
        raise RpcError(f"tensor '{name}' cannot be sent over RPC (ne={list(ne)}, nb={list(nb)}: the protocol "
                       f"carries ne and nb as u32): {e}") from None


HELLO_REQ = struct.Struct(f"<{RPC_CONN_CAPS_SIZE}s")
HELLO_RSP = struct.Struct(f"<BBBB{RPC_CONN_CAPS_SIZE}s")  # major, minor, patch, padding, conn_caps
DEVICE_COUNT_RSP = struct.Struct("<I")
GET_ALLOC_SIZE_REQ_HEAD = struct.Struct("<I")  # device, then rpc_tensor tensor, rpc_tensor srcs[GGML_MAX_SRC]
GET_ALLOC_SIZE_REQ_SIZE = 4 + RPC_TENSOR_SIZE * (1 + GGML_MAX_SRC)
GET_ALLOC_SIZE_RSP = struct.Struct("<Q")
INIT_TENSOR_REQ_SIZE = RPC_TENSOR_SIZE
ALLOC_BUFFER_REQ = struct.Struct("<IQ")
ALLOC_BUFFER_RSP = struct.Struct("<QQ")  # remote_ptr, remote_size
GET_ALIGNMENT_REQ = struct.Struct("<I")
GET_ALIGNMENT_RSP = struct.Struct("<Q")
GET_MAX_SIZE_REQ = struct.Struct("<I")
GET_MAX_SIZE_RSP = struct.Struct("<Q")
BUFFER_GET_BASE_REQ = struct.Struct("<Q")
BUFFER_GET_BASE_RSP = struct.Struct("<Q")
FREE_BUFFER_REQ = struct.Struct("<Q")
BUFFER_CLEAR_REQ = struct.Struct("<QB")
MEMSET_TENSOR_REQ_TAIL = struct.Struct("<QQB")  # after the rpc_tensor: offset, size, value
SET_TENSOR_HASH_REQ_TAIL = struct.Struct("<QQ")  # after the rpc_tensor: offset, hash
SET_TENSOR_HASH_RSP = struct.Struct("<B")
GET_TENSOR_REQ_TAIL = struct.Struct("<QQ")  # after the rpc_tensor: offset, size
COPY_TENSOR_REQ_SIZE = 2 * RPC_TENSOR_SIZE
COPY_TENSOR_RSP = struct.Struct("<B")
GET_DEVICE_MEMORY_REQ = struct.Struct("<I")
GET_DEVICE_MEMORY_RSP = struct.Struct("<QQ")  # free_mem, total_mem
GRAPH_RECOMPUTE_REQ = struct.Struct("<I")
SET_TENSOR_HEAD_TAIL = struct.Struct("<BQ")


C_SIZEOF = {
    "rpc_tensor": 296,
    "rpc_msg_hello_req": 24,
    "rpc_msg_hello_rsp": 28,
    "rpc_msg_device_count_rsp": 4,
    "rpc_msg_get_alloc_size_req": 3260,
    "rpc_msg_get_alloc_size_rsp": 8,
    "rpc_msg_init_tensor_req": 296,
    "rpc_msg_alloc_buffer_req": 12,
    "rpc_msg_alloc_buffer_rsp": 16,
    "rpc_msg_get_alignment_req": 4,
    "rpc_msg_get_alignment_rsp": 8,
    "rpc_msg_get_max_size_req": 4,
    "rpc_msg_get_max_size_rsp": 8,
    "rpc_msg_buffer_get_base_req": 8,
    "rpc_msg_buffer_get_base_rsp": 8,
    "rpc_msg_free_buffer_req": 8,
    "rpc_msg_buffer_clear_req": 9,
    "rpc_msg_memset_tensor_req": 313,
    "rpc_msg_set_tensor_hash_req": 312,
    "rpc_msg_set_tensor_hash_rsp": 1,
    "rpc_msg_get_tensor_req": 312,
    "rpc_msg_copy_tensor_req": 592,
    "rpc_msg_copy_tensor_rsp": 1,
    "rpc_msg_get_device_memory_req": 4,
    "rpc_msg_get_device_memory_rsp": 16,
    "rpc_msg_graph_recompute_req": 4,
}

MEMSET_TENSOR_REQ_SIZE = RPC_TENSOR_SIZE + MEMSET_TENSOR_REQ_TAIL.size
SET_TENSOR_HASH_REQ_SIZE = RPC_TENSOR_SIZE + SET_TENSOR_HASH_REQ_TAIL.size
GET_TENSOR_REQ_SIZE = RPC_TENSOR_SIZE + GET_TENSOR_REQ_TAIL.size
SET_TENSOR_HEADER_SIZE = RPC_TENSOR_SIZE + SET_TENSOR_HEAD_TAIL.size


REQUEST_SIZE: dict[RpcCmd, int | None] = {
    RpcCmd.ALLOC_BUFFER: ALLOC_BUFFER_REQ.size,
    RpcCmd.GET_ALIGNMENT: GET_ALIGNMENT_REQ.size,
    RpcCmd.GET_MAX_SIZE: GET_MAX_SIZE_REQ.size,
    RpcCmd.BUFFER_GET_BASE: BUFFER_GET_BASE_REQ.size,
    RpcCmd.FREE_BUFFER: FREE_BUFFER_REQ.size,
    RpcCmd.BUFFER_CLEAR: BUFFER_CLEAR_REQ.size,
    RpcCmd.SET_TENSOR: None,
    RpcCmd.SET_TENSOR_HASH: SET_TENSOR_HASH_REQ_SIZE,
    RpcCmd.GET_TENSOR: GET_TENSOR_REQ_SIZE,
    RpcCmd.COPY_TENSOR: COPY_TENSOR_REQ_SIZE,
    RpcCmd.GRAPH_COMPUTE: None,
    RpcCmd.GET_DEVICE_MEMORY: GET_DEVICE_MEMORY_REQ.size,
    RpcCmd.INIT_TENSOR: INIT_TENSOR_REQ_SIZE,
    RpcCmd.GET_ALLOC_SIZE: GET_ALLOC_SIZE_REQ_SIZE,
    RpcCmd.HELLO: HELLO_REQ.size,
    RpcCmd.DEVICE_COUNT: 0,
    RpcCmd.GRAPH_RECOMPUTE: GRAPH_RECOMPUTE_REQ.size,
    RpcCmd.MEMSET_TENSOR: MEMSET_TENSOR_REQ_SIZE,
}


CMD_HEADER = struct.Struct("<BQ")
SIZE_HEADER = struct.Struct("<Q")


def frame_request(cmd: RpcCmd | int, payload: bytes | bytearray | memoryview = b"") -> bytes:
    return CMD_HEADER.pack(int(cmd), len(payload)) + bytes(payload)


def frame_response(payload: bytes | bytearray | memoryview) -> bytes:
    return SIZE_HEADER.pack(len(payload)) + bytes(payload)


def pack_set_tensor(tensor: bytes, cache_flag: int, offset: int, data: bytes | memoryview) -> bytes:
    """SET_TENSOR's payload: | rpc_tensor | cache_flag (u8) | offset (u64) | data |."""
    return b"".join((tensor, SET_TENSOR_HEAD_TAIL.pack(cache_flag, offset), bytes(data)))


def unpack_set_tensor(payload: bytes | memoryview) -> tuple[RpcTensor, int, int, memoryview]:
    if len(payload) < SET_TENSOR_HEADER_SIZE:
        raise RpcError(f"SET_TENSOR: payload of {len(payload)} bytes is shorter than its {SET_TENSOR_HEADER_SIZE}-"
                       f"byte header")
    cache_flag, offset = SET_TENSOR_HEAD_TAIL.unpack_from(payload, RPC_TENSOR_SIZE)
    return RpcTensor.unpack(payload), cache_flag, offset, memoryview(payload)[SET_TENSOR_HEADER_SIZE:]


def pack_graph(device: int, node_ids: list[int], tensors: list[bytes]) -> bytes:
    """GRAPH_COMPUTE's payload: | device (u32) | n_nodes (u32) | node ids (u64 each) | n_tensors (u32) |
    tensors (rpc_tensor each) |."""
    return b"".join((struct.pack(f"<II{len(node_ids)}Q", device, len(node_ids), *node_ids),
                     struct.pack("<I", len(tensors)), *tensors))


def unpack_graph(payload: bytes | memoryview) -> tuple[int, list[int], list[RpcTensor]]:
    """(device, node ids, tensors) of a GRAPH_COMPUTE payload; RpcError naming the sizes if short or long."""
    n = len(payload)
    if n < 8:
        raise RpcError(f"GRAPH_COMPUTE: payload of {n} bytes is shorter than its 8-byte header")
    device, n_nodes = struct.unpack_from("<II", payload, 0)
    need = 8 + 8 * n_nodes + 4
    if n < need:
        raise RpcError(f"GRAPH_COMPUTE: {n_nodes} nodes need {need} bytes, the payload has {n}")
    (n_tensors,) = struct.unpack_from("<I", payload, need - 4)
    total = need + n_tensors * RPC_TENSOR_SIZE
    if n != total:
        raise RpcError(f"GRAPH_COMPUTE: {n_nodes} nodes and {n_tensors} tensors make {total} bytes, the payload "
                       f"has {n}")
    if n_nodes > n_tensors:
        raise RpcError(f"GRAPH_COMPUTE: {n_nodes} nodes, more than its {n_tensors} tensors")
    node_ids = list(struct.unpack_from(f"<{n_nodes}Q", payload, 8))
    tensors = [RpcTensor.unpack(payload, need + i * RPC_TENSOR_SIZE) for i in range(n_tensors)]
    return device, node_ids, tensors


def pack_hello_rsp(major: int = RPC_PROTO_MAJOR_VERSION, minor: int = RPC_PROTO_MINOR_VERSION,
                   patch: int = RPC_PROTO_PATCH_VERSION, conn_caps: bytes = bytes(RPC_CONN_CAPS_SIZE)) -> bytes:
    return HELLO_RSP.pack(major, minor, patch, 0, conn_caps)


def check_version(major: int, minor: int, patch: int, endpoint: str) -> None:
    """The client's rule (negotiate_hello): refuse a server whose major differs or whose minor is higher."""
    if major != RPC_PROTO_MAJOR_VERSION or minor > RPC_PROTO_MINOR_VERSION:
        raise RpcVersionError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; this client speaks "
                              f"{RPC_PROTO_MAJOR_VERSION}.{RPC_PROTO_MINOR_VERSION}.{RPC_PROTO_PATCH_VERSION} "
                              f"(the major must match and the minor be at most ours)")


# --- FNV-1a, the hash of SET_TENSOR_HASH and of the server's cache files ---

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_fnv_jit = None


def fnv_hash(data: bytes | memoryview | np.ndarray, hash: int = FNV_OFFSET) -> int:
    """fnv_hash: 64-bit FNV-1a of the bytes (numba-compiled: weights of many MiB are hashed)."""
    global _fnv_jit
    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    if _fnv_jit is None:
        import numba

        @numba.njit(cache=True, nogil=True)
        def _fnv(a: np.ndarray, h: np.uint64) -> np.uint64:  # pragma: no cover - compiled
            prime = np.uint64(FNV_PRIME)
            for i in range(a.shape[0]):
                h = (h ^ np.uint64(a[i])) * prime
            return h

        _fnv_jit = _fnv
    return int(_fnv_jit(arr, np.uint64(hash)))


def fnv_hash_py(data: bytes, hash: int = FNV_OFFSET) -> int:
    """FNV-1a in plain Python (the tests' reference)."""
    for b in data:
        hash = ((hash ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return hash


def send_parts(sock: socket.socket, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Send `parts` in one gathered sendmsg (no joined copy); the rest by sendall from where it stopped."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return
    sent = sock.sendmsg(parts)
    for part in parts:
        view = memoryview(part).cast("B")
        if sent >= len(view):
            sent -= len(view)
            continue
        sock.sendall(view[sent:])
        sent = 0
