"""The `rpc` backend: devices of a remote ggml RPC server, as ggml-rpc.cpp's client (llama.cpp 0c1e570).

Registry "rpc" lists no device until a server is added ("rpc://HOST:PORT[/DEVICE]"); buffers, addresses and
graphs live on the server. Where it goes beyond the C client (GRAPH_RECOMPUTE by bytes, supports_op, faults):
DESIGN.md, "The RPC backend".
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable
from typing import Any

from pyggml.backends.rpc import wire
from pyggml.backends.rpc.connection import Connection, connect, parse_endpoint
from pyggml.backends.rpc.wire import RpcCmd, RpcConnectionError, RpcError
from pyggml.core.errors import ArgumentError, OutOfMemoryError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, TensorFlag
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer, BufferUsage, tensor_buffer
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.device import Device, DeviceCaps, DeviceType
from pyggml.ggml_backend.registry import Reg

log = logging.getLogger("pyggml.backends.rpc")

# ops that carry a function pointer of the sending process: no server can run them
HOST_FUNCTION_OPS = frozenset({GGMLOp.MAP_CUSTOM1, GGMLOp.MAP_CUSTOM2, GGMLOp.MAP_CUSTOM3, GGMLOp.CUSTOM})
# ggml_op_alloc_size_may_expand: ops a server's backend may want more memory for
ALLOC_SIZE_MAY_EXPAND = frozenset({GGMLOp.FLASH_ATTN_EXT, GGMLOp.MUL_MAT, GGMLOp.MUL_MAT_ID, GGMLOp.CUMSUM,
                                   GGMLOp.ARGSORT, GGMLOp.TOP_K})
U32_MAX = 2**32 - 1
COMPUTE_FLAG = int(TensorFlag.COMPUTE)
NO_SRC = [0] * 10
EMPTY_BASE = 0x1000  # ggml's is NULL; pyggml's bases never are


def _needs_server_init(t: Tensor) -> bool:
    """The C client's rule for INIT_TENSOR and GET_ALLOC_SIZE: quantized, rows not a multiple of 512 (a
    CUDA server pads those), and not a view."""
    return TYPE_TRAITS[t.type].is_quantized and t.ne[0] % 512 != 0 and t.view_src is None


def serialize_tensor(t: Tensor | None, conn: Connection | None, extra_flags: int = 0, strict: bool = False) -> bytes:
    """serialize_tensor: the rpc_tensor of `t` (zeros for None), buffer and data only if on this server;
    `strict` (graphs) refuses memory elsewhere, which the server would compute at NULL."""
    if t is None:
        return wire.NULL_TENSOR
    buffer = tensor_buffer(t)
    data = t.data
    # ggml-rpc-server aborts on a tensor outside its buffer (a measure allocator's fake addresses)
    if isinstance(buffer, RPCBuffer) and (conn is None or buffer.conn is conn) and data is not None \
            and buffer.base <= data and data + t.nbytes() <= buffer.base + buffer.size:
        remote = buffer.remote_ptr
    else:
        if strict and data is not None:
            where = f"buffer '{buffer.name}'" if buffer is not None else "no buffer"
            if isinstance(buffer, RPCBuffer) and buffer.conn is not conn:
                where += f" of an earlier connection to {buffer.conn.endpoint} ({buffer.conn.broken})"
            raise RpcError(f"graph for RPC server {conn.endpoint if conn else '?'}: tensor '{t.name}' "
                           f"({t.op.name}) has its memory in {where}, not on that server")
        remote, data = 0, 0
    # a leaf's sources (the scheduler links an input copy to its source) do not travel
    src = [id(s) if s is not None else 0 for s in t.src] if t.op != GGMLOp.NONE else NO_SRC
    view_src = id(t.view_src) if t.view_src is not None else 0
    return wire.pack_tensor(id(t), int(t.type), remote, t.ne, t.nb, int(t.op), t.op_params,
                            int(t.flags) | extra_flags, src, view_src, t.view_offs, data, t.name)


def serialize_graph(device: int, nodes: list[Tensor], conn: Connection) -> bytes:
    """serialize_graph: device, node ids, then the tensors reached, depth first, in add_tensor's order."""
    return _serialize_graph(device, nodes, conn)[0]


def _serialize_graph(device: int, nodes: list[Tensor], conn: Connection) -> tuple[bytes, list[Tensor]]:
    visited: set[int] = set()
    out: list[bytes] = []
    tensors: list[Tensor] = []
    # ggml's backends skip nodes without ggml_build_forward_expand's COMPUTE flag; pyggml's set it on the wire
    node_ids = {id(n) for n in nodes if n.op != GGMLOp.NONE}
    for node in nodes:
        # iterative: long chains must not hit Python's recursion limit
        stack: list[tuple[Tensor, int]] = [(node, 0)]
        while stack:
            t, i = stack.pop()
            if i == 0:
                if id(t) in visited:
                    continue
                visited.add(id(t))
            children = (*t.src, t.view_src) if t.op != GGMLOp.NONE else (t.view_src,)
            while i < len(children) and (children[i] is None or id(children[i]) in visited):
                i += 1
            if i < len(children):
                child = children[i]
                assert child is not None
                stack.append((t, i + 1))
                stack.append((child, 0))
                continue
            out.append(serialize_tensor(t, conn, COMPUTE_FLAG if id(t) in node_ids else 0, strict=True))
            tensors.append(t)
    return wire.pack_graph(device, [id(n) for n in nodes], out), tensors


class RPCPlan:
    """A graph as `graph_plan_create` serialized it, with its tensors' `data` then: unchanged nodes and
    addresses send GRAPH_RECOMPUTE unserialized (in place of the C client's graph uids)."""

    __slots__ = ("graph", "nodes", "tensors", "datas", "payload", "n_buffers_freed")

    def __init__(self, graph: Graph, payload: bytes, tensors: list[Tensor], n_buffers_freed: int) -> None:
        self.graph = graph
        self.update(payload, tensors, n_buffers_freed)

    def update(self, payload: bytes, tensors: list[Tensor], n_buffers_freed: int) -> None:
        self.nodes = list(self.graph.nodes)
        self.payload = payload
        self.tensors = tensors
        self.datas = [t.data for t in tensors]
        self.n_buffers_freed = n_buffers_freed

    def unchanged(self) -> bool:
        return self.graph.nodes == self.nodes and [t.data for t in self.tensors] == self.datas


class RPCBuffer(Buffer):
    """A buffer on the server: `remote_ptr` names it there, `base` is its address there."""

    def __init__(self, buft: RPCBufferType, conn: Connection, remote_ptr: int, size: int) -> None:
        super().__init__(None, size, buft=buft)
        self.conn = conn
        self.remote_ptr = remote_ptr
        rsp = conn.request(RpcCmd.BUFFER_GET_BASE, wire.BUFFER_GET_BASE_REQ.pack(remote_ptr),
                           wire.BUFFER_GET_BASE_RSP.size)
        (self.base,) = wire.BUFFER_GET_BASE_RSP.unpack(rsp)
        if not self.base and size == 0:
            self.base = EMPTY_BASE
        if not self.base:
            raise RpcError(f"RPC server {conn.endpoint}: buffer {remote_ptr:#x} of {size} bytes has base address 0")

    def _get_base(self) -> int:
        return self.base

    def _free_buffer(self) -> None:
        conn = self.conn
        with conn.lock:
            if conn.broken is not None:
                return  # the server's memory went with the connection
            # the server drops its stored graphs when a buffer goes (they may point into it)
            conn.last_graph.clear()
            conn.n_buffers_freed += 1
            conn.send(RpcCmd.FREE_BUFFER, wire.FREE_BUFFER_REQ.pack(self.remote_ptr), defer=True)

    def _init_tensor(self, tensor: Tensor) -> None:
        if _needs_server_init(tensor):
            self.conn.send(RpcCmd.INIT_TENSOR, serialize_tensor(tensor, self.conn), defer=True)

    def _clear(self, value: int) -> None:
        self.conn.send(RpcCmd.BUFFER_CLEAR, wire.BUFFER_CLEAR_REQ.pack(self.remote_ptr, value), defer=True)

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.conn.send(RpcCmd.MEMSET_TENSOR, serialize_tensor(tensor, self.conn)
                       + wire.MEMSET_TENSOR_REQ_TAIL.pack(offset, size, value), defer=True)

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        rt = serialize_tensor(tensor, self.conn)
        payload = data[:size]
        cache_flag = 0
        if size > wire.HASH_THRESHOLD and self.usage == BufferUsage.WEIGHTS:
            h = wire.fnv_hash(payload)
            rsp = self.conn.request(RpcCmd.SET_TENSOR_HASH, rt + wire.SET_TENSOR_HASH_REQ_TAIL.pack(offset, h),
                                    wire.SET_TENSOR_HASH_RSP.size)
            if rsp[0]:
                return  # the server had the bytes in its cache
            cache_flag = 1
        # two parts: a large payload goes from the caller's memory uncopied; a small one waits for the step's graph
        self.conn.send(RpcCmd.SET_TENSOR, rt + wire.SET_TENSOR_HEAD_TAIL.pack(cache_flag, offset), payload,
                       defer=True)

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        req = serialize_tensor(tensor, self.conn) + wire.GET_TENSOR_REQ_TAIL.pack(offset, size)
        self.conn.request(RpcCmd.GET_TENSOR, req, size, out=data[:size])

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        src_buffer = tensor_buffer(src)
        if not isinstance(src_buffer, RPCBuffer) or src_buffer.conn is not self.conn:
            return False
        rsp = self.conn.request(RpcCmd.COPY_TENSOR, serialize_tensor(src, self.conn)
                                + serialize_tensor(dst, self.conn), wire.COPY_TENSOR_RSP.size)
        return bool(rsp[0])

    def _is_host(self) -> bool:
        return False


class RPCBufferType(BufferType):
    """The memory of one remote device; alignment, max size and alloc sizes asked once per connection."""

    def __init__(self, device: RPCDevice) -> None:
        super().__init__(device)
        self.rpc_device = device
        self._alignment: int | None = None
        self._max_size: int | None = None
        self._alloc_sizes: dict[bytes, int] = {}

    def _get_name(self) -> str:
        return self.rpc_device.name()

    def _conn(self) -> Connection:
        return self.rpc_device.conn()

    def _get_alignment(self) -> int:
        conn = self._conn()
        if self._alignment is None:
            rsp = conn.request(RpcCmd.GET_ALIGNMENT, wire.GET_ALIGNMENT_REQ.pack(self.rpc_device.index),
                               wire.GET_ALIGNMENT_RSP.size)
            (self._alignment,) = wire.GET_ALIGNMENT_RSP.unpack(rsp)
        return self._alignment

    def _get_max_size(self) -> int:
        conn = self._conn()
        if self._max_size is None:
            rsp = conn.request(RpcCmd.GET_MAX_SIZE, wire.GET_MAX_SIZE_REQ.pack(self.rpc_device.index),
                               wire.GET_MAX_SIZE_RSP.size)
            (self._max_size,) = wire.GET_MAX_SIZE_RSP.unpack(rsp)
        return self._max_size

    def _get_alloc_size(self, tensor: Tensor) -> int:
        nbytes = tensor.nbytes()
        if not (_needs_server_init(tensor) or tensor.op in ALLOC_SIZE_MAY_EXPAND):
            return nbytes
        # alloc sizes depend on the tensor's layout and op, not its sources' sizes (the C client's key)
        key = struct.pack("<II", int(tensor.type), int(tensor.op)) + tensor.op_params.tobytes() \
            + struct.pack("<4q4q", *tensor.ne, *tensor.nb)
        conn = self._conn()
        size = self._alloc_sizes.get(key)
        if size is None:
            req = b"".join((wire.GET_ALLOC_SIZE_REQ_HEAD.pack(self.rpc_device.index),
                            serialize_tensor(tensor, conn), *(serialize_tensor(s, conn) for s in tensor.src)))
            rsp = conn.request(RpcCmd.GET_ALLOC_SIZE, req, wire.GET_ALLOC_SIZE_RSP.size)
            (size,) = wire.GET_ALLOC_SIZE_RSP.unpack(rsp)
            self._alloc_sizes[key] = size
        return max(size, nbytes)

    def _alloc_buffer(self, size: int) -> Buffer:
        conn = self._conn()
        rsp = conn.request(RpcCmd.ALLOC_BUFFER, wire.ALLOC_BUFFER_REQ.pack(self.rpc_device.index, size),
                           wire.ALLOC_BUFFER_RSP.size)
        remote_ptr, remote_size = wire.ALLOC_BUFFER_RSP.unpack(rsp)
        if remote_ptr == 0:
            raise OutOfMemoryError(f"RPC server {conn.endpoint}: device {self.rpc_device.index} could not "
                                   f"allocate a buffer of {size} bytes")
        return RPCBuffer(self, conn, remote_ptr, remote_size)

    def _is_host(self) -> bool:
        return False


class RPCBackend(Backend):
    """A backend computing on device `device.index` of the server."""

    def __init__(self, device: RPCDevice) -> None:
        super().__init__(device)
        self.rpc_device = device
        self.n_computes = 0
        self.n_recomputes = 0
        self._conn: Connection | None = None  # the first compute's, for good (as C's dispatcher)

    def _get_name(self) -> str:
        return self.rpc_device.name()

    def conn(self) -> Connection:
        """Once it breaks every compute raises (a new connection would lack this backend's buffers)."""
        if self._conn is None:
            self._conn = self.rpc_device.conn()
        return self._conn

    def _graph_compute(self, graph: Graph) -> None:
        if not graph.nodes:
            return  # the C client asserts n_nodes > 0; an empty graph has nothing to do
        conn = self.conn()
        self._send_graph(conn, serialize_graph(self.rpc_device.index, graph.nodes, conn))

    def _send_graph(self, conn: Connection, payload: bytes) -> bool:
        """GRAPH_RECOMPUTE when the server holds these bytes on this device (True), else GRAPH_COMPUTE."""
        index = self.rpc_device.index
        with conn.lock:
            last = conn.last_graph.get(index)
            if last is payload or last == payload:
                conn.send(RpcCmd.GRAPH_RECOMPUTE, wire.GRAPH_RECOMPUTE_REQ.pack(index))
                conn.last_graph[index] = payload  # a plan's own object passes `is` next time
                self.n_recomputes += 1
                return True
            conn.last_graph.pop(index, None)
            conn.send(RpcCmd.GRAPH_COMPUTE, payload)
            conn.last_graph[index] = payload
            self.n_computes += 1
            return False

    def _graph_plan_create(self, graph: Graph) -> RPCPlan | None:
        if not graph.nodes:
            return None
        conn = self.conn()
        payload, tensors = _serialize_graph(self.rpc_device.index, graph.nodes, conn)
        return RPCPlan(graph, payload, tensors, conn.n_buffers_freed)

    def _graph_plan_compute(self, plan: RPCPlan | None) -> None:
        if plan is None:
            return
        conn = self.conn()
        # a freed buffer's id may be among the bytes (and a new buffer can take its address): made anew then
        if plan.n_buffers_freed != conn.n_buffers_freed or not plan.unchanged():
            payload, tensors = _serialize_graph(self.rpc_device.index, plan.graph.nodes, conn)
            plan.update(payload, tensors, conn.n_buffers_freed)
        self._send_graph(conn, plan.payload)

    def _plans_follow_moves(self) -> bool:
        return True

    def _io_ordered(self) -> bool:
        # the server serves commands in order and a deferred SET_TENSOR copied its bytes: no sync before copies
        return True

    def _synchronize(self) -> None:
        if self._conn is not None:
            self._conn.synchronize()

    def _free(self) -> None:
        ...  # buffers are freed with their buffers

    def describe(self) -> str:
        conn = self.rpc_device.conn_if_open()
        if conn is None:
            return f"RPC server {self.rpc_device.endpoint} (not connected)"
        version = ".".join(map(str, conn.version))
        return f"RPC server {conn.endpoint}, protocol {version}, device {self.rpc_device.index}"


class RPCDevice(Device):
    """Device `index` of the RPC server at `endpoint`."""

    def __init__(self, reg: RPCReg, endpoint: str, index: int) -> None:
        super().__init__(reg)
        self.endpoint = endpoint
        self.index = index
        self._conn: Connection | None = None
        self.buft = RPCBufferType(self)

    def conn(self) -> Connection:
        """The endpoint's open connection, made again if the last broke under no live buffer of this device."""
        conn = self._conn
        if conn is None or conn.broken is not None:
            conn = connect(self.endpoint)
            if self._conn is not None and self._conn is not conn:
                self.buft._alignment = self.buft._max_size = None
                self.buft._alloc_sizes.clear()
            self._conn = conn
        return conn

    def conn_if_open(self) -> Connection | None:
        return self._conn if self._conn is not None and self._conn.broken is None else None

    def _get_name(self) -> str:
        return f"RPC{self.index}[{self.endpoint}]"

    def _get_description(self) -> str:
        return f"device {self.index} of RPC server {self.endpoint}"

    def _get_memory(self) -> tuple[int, int]:
        """(0, 0) for a server that cannot be reached: listing devices must not fail."""
        try:
            return self.server_memory()
        except RpcConnectionError as e:
            log.warning("%s: no memory to report: %s", self.name(), e)
            return 0, 0

    def server_memory(self) -> tuple[int, int]:
        rsp = self.conn().request(RpcCmd.GET_DEVICE_MEMORY, wire.GET_DEVICE_MEMORY_REQ.pack(self.index),
                                  wire.GET_DEVICE_MEMORY_RSP.size)
        free, total = wire.GET_DEVICE_MEMORY_RSP.unpack(rsp)
        return min(free, total), total

    def _get_type(self) -> DeviceType:
        return DeviceType.GPU  # as the C client (it cannot ask the server)

    def _get_caps(self) -> DeviceCaps:
        return DeviceCaps()

    def _init_backend(self, params: str | None) -> RPCBackend:
        if params:
            raise ArgumentError(f"the rpc backend takes no parameters, got {params!r}")
        return RPCBackend(self)

    def _get_buffer_type(self) -> BufferType:
        return self.buft

    def _supports_op(self, op: Tensor) -> bool:
        return rpc_supports_op(op)

    def _supports_buft(self, buft: BufferType) -> bool:
        return buft is self.buft


def _wire_ok(t: Tensor) -> bool:
    if t.type not in GGMLType._value2member_map_ or TYPE_TRAITS[t.type].blck_size == 0:
        return False
    return all(0 <= n <= U32_MAX for n in t.ne) and all(0 <= n <= U32_MAX for n in t.nb)


def rpc_supports_op(op: Tensor) -> bool:
    """Unlike the C client (all true): known ops without host function pointers, known types, u32 layouts."""
    if op.op not in GGMLOp._value2member_map_ or op.op in HOST_FUNCTION_OPS:
        return False
    return _wire_ok(op) and all(_wire_ok(s) for s in op.src if s is not None)


class RPCReg(Reg):
    """The rpc registry: the devices of the servers added so far (none until one is)."""

    def __init__(self) -> None:
        super().__init__()
        self._servers: dict[str, tuple[Connection, list[RPCDevice]]] = {}  # the connection devices were counted on
        self._lock = threading.Lock()

    def _get_name(self) -> str:
        return "rpc"

    def _all(self) -> list[RPCDevice]:
        return [d for _, devs in self._servers.values() for d in devs]

    def _get_device_count(self) -> int:
        return len(self._all())

    def _get_device(self, index: int) -> Device:
        return self._all()[index]

    def _get_proc_address(self, name: str) -> Callable[..., Any] | None:
        from pyggml.backends.rpc import server

        return {"ggml_backend_rpc_add_server": self.add_server,
                "ggml_backend_rpc_start_server": server.start_server,
                "pyggml_rpc_server": server.RpcServer}.get(name)

    def add_server(self, endpoint: str) -> list[RPCDevice]:
        """ggml_backend_rpc_add_server: `endpoint`'s devices, counted again once their connection is gone."""
        host, port, _ = parse_endpoint(endpoint)
        key = f"{host}:{port}"
        with self._lock:
            listed_on, devs = self._servers.get(key, (None, []))
            if listed_on is not None and listed_on.broken is None:
                return devs
        conn = connect(key)
        rsp = conn.request(RpcCmd.DEVICE_COUNT, b"", wire.DEVICE_COUNT_RSP.size)
        (count,) = wire.DEVICE_COUNT_RSP.unpack(rsp)
        with self._lock:
            kept = self._servers.get(key, (None, []))[1][:count]  # the devices handed out keep their objects
            devs = kept + [RPCDevice(self, key, i) for i in range(len(kept), count)]
            self._servers[key] = (conn, devs)
        return devs

    def device(self, endpoint: str) -> RPCDevice:
        """The device of "HOST:PORT[/DEVICE]" (device 0 without '/'), adding the server if needed."""
        _, _, index = parse_endpoint(endpoint)
        devs = self.add_server(endpoint)
        index = index or 0
        if index >= len(devs):
            raise ArgumentError(f"RPC server {devs[0].endpoint if devs else endpoint} has {len(devs)} device(s), "
                                f"no device {index}")
        return devs[index]

    def _init_backend(self, arg: str | None) -> Backend:
        if not arg:
            raise ArgumentError("the rpc backend needs a server: 'rpc://HOST:PORT[/DEVICE]'")
        return self.device(arg).init_backend(None)


_reg: RPCReg | None = None


def rpc_reg() -> RPCReg:
    """ggml_backend_rpc_reg: the rpc registry (one per process)."""
    global _reg
    if _reg is None:
        _reg = RPCReg()
    return _reg


def rpc_init(endpoint: str, device: int = 0) -> RPCBackend:
    """ggml_backend_rpc_init: a backend of device `device` of the server at `endpoint`."""
    host, port, _ = parse_endpoint(endpoint)
    backend = rpc_reg().device(f"{host}:{port}/{device}").init_backend(None)
    assert isinstance(backend, RPCBackend)
    return backend


def is_rpc(backend: object) -> bool:
    return isinstance(backend, RPCBackend)


def rpc_buffer_type(endpoint: str, device: int = 0) -> RPCBufferType:
    host, port, _ = parse_endpoint(endpoint)
    return rpc_reg().device(f"{host}:{port}/{device}").buft


def rpc_get_device_memory(endpoint: str, device: int = 0) -> tuple[int, int]:
    """ggml_backend_rpc_get_device_memory: (free, total) bytes."""
    host, port, _ = parse_endpoint(endpoint)
    return rpc_reg().device(f"{host}:{port}/{device}").server_memory()


__all__ = ["RPCBackend", "RPCBuffer", "RPCBufferType", "RPCDevice", "RPCPlan", "RPCReg", "is_rpc",
           "rpc_buffer_type", "rpc_get_device_memory", "rpc_init", "rpc_reg", "rpc_supports_op",
           "serialize_graph", "serialize_tensor"]
