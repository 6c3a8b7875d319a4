"""ggml-rpc.h by its C names: the rpc client backend and the server (pyggml.backends.rpc).

`endpoint` is "HOST:PORT"; `ggml_backend_rpc_get_device_memory` returns (free, total) instead of filling
two pointers; `ggml_backend_rpc_start_server` serves pyggml devices and never returns (as the C one).
"""

from __future__ import annotations

from typing import Any

from pyggml.backends.rpc import client, server, wire
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.registry import Reg

__all__ = [
    "RPC_PROTO_MAJOR_VERSION", "RPC_PROTO_MINOR_VERSION", "RPC_PROTO_PATCH_VERSION", "GGML_RPC_MAX_SERVERS",
    "ggml_backend_rpc_init", "ggml_backend_is_rpc", "ggml_backend_rpc_buffer_type",
    "ggml_backend_rpc_get_device_memory", "ggml_backend_rpc_start_server", "ggml_backend_rpc_reg",
    "ggml_backend_rpc_add_server",
]

RPC_PROTO_MAJOR_VERSION = wire.RPC_PROTO_MAJOR_VERSION
RPC_PROTO_MINOR_VERSION = wire.RPC_PROTO_MINOR_VERSION
RPC_PROTO_PATCH_VERSION = wire.RPC_PROTO_PATCH_VERSION
GGML_RPC_MAX_SERVERS = wire.GGML_RPC_MAX_SERVERS


def ggml_backend_rpc_init(endpoint: str, device: int) -> Backend:
    return client.rpc_init(endpoint, device)


def ggml_backend_is_rpc(backend: Backend | None) -> bool:
    return backend is not None and client.is_rpc(backend)


def ggml_backend_rpc_buffer_type(endpoint: str, device: int) -> BufferType:
    return client.rpc_buffer_type(endpoint, device)


def ggml_backend_rpc_get_device_memory(endpoint: str, device: int) -> tuple[int, int]:
    return client.rpc_get_device_memory(endpoint, device)


def ggml_backend_rpc_start_server(endpoint: str, cache_dir: str | None, n_threads: int, n_devices: int,
                                  devices: list[Any]) -> None:
    server.start_server(endpoint, cache_dir, n_threads, n_devices, devices)


def ggml_backend_rpc_reg() -> Reg:
    return client.rpc_reg()


def ggml_backend_rpc_add_server(endpoint: str) -> Reg:
    """The registry of the server's devices: pyggml's one rpc registry, which lists them once added."""
    reg = client.rpc_reg()
    reg.add_server(endpoint)
    return reg
