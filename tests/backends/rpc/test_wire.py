"""The wire format of ggml's RPC protocol: struct sizes equal the C sizeofs, packing round-trips."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyggml.backends.rpc import wire
from pyggml.backends.rpc.wire import RpcCmd, RpcError, RpcTensor

STRUCTS = {
    "rpc_tensor": wire.RPC_TENSOR.size,
    "rpc_msg_hello_req": wire.HELLO_REQ.size,
    "rpc_msg_hello_rsp": wire.HELLO_RSP.size,
    "rpc_msg_device_count_rsp": wire.DEVICE_COUNT_RSP.size,
    "rpc_msg_get_alloc_size_req": wire.GET_ALLOC_SIZE_REQ_SIZE,
    "rpc_msg_get_alloc_size_rsp": wire.GET_ALLOC_SIZE_RSP.size,
    "rpc_msg_init_tensor_req": wire.INIT_TENSOR_REQ_SIZE,
    "rpc_msg_alloc_buffer_req": wire.ALLOC_BUFFER_REQ.size,
    "rpc_msg_alloc_buffer_rsp": wire.ALLOC_BUFFER_RSP.size,
    "rpc_msg_get_alignment_req": wire.GET_ALIGNMENT_REQ.size,
    "rpc_msg_get_alignment_rsp": wire.GET_ALIGNMENT_RSP.size,
    "rpc_msg_get_max_size_req": wire.GET_MAX_SIZE_REQ.size,
    "rpc_msg_get_max_size_rsp": wire.GET_MAX_SIZE_RSP.size,
    "rpc_msg_buffer_get_base_req": wire.BUFFER_GET_BASE_REQ.size,
    "rpc_msg_buffer_get_base_rsp": wire.BUFFER_GET_BASE_RSP.size,
    "rpc_msg_free_buffer_req": wire.FREE_BUFFER_REQ.size,
    "rpc_msg_buffer_clear_req": wire.BUFFER_CLEAR_REQ.size,
    "rpc_msg_memset_tensor_req": wire.MEMSET_TENSOR_REQ_SIZE,
    "rpc_msg_set_tensor_hash_req": wire.SET_TENSOR_HASH_REQ_SIZE,
    "rpc_msg_set_tensor_hash_rsp": wire.SET_TENSOR_HASH_RSP.size,
    "rpc_msg_get_tensor_req": wire.GET_TENSOR_REQ_SIZE,
    "rpc_msg_copy_tensor_req": wire.COPY_TENSOR_REQ_SIZE,
    "rpc_msg_copy_tensor_rsp": wire.COPY_TENSOR_RSP.size,
    "rpc_msg_get_device_memory_req": wire.GET_DEVICE_MEMORY_REQ.size,
    "rpc_msg_get_device_memory_rsp": wire.GET_DEVICE_MEMORY_RSP.size,
    "rpc_msg_graph_recompute_req": wire.GRAPH_RECOMPUTE_REQ.size,
}


def test_sizes_equal_the_sizeofs_read_from_the_source() -> None:
    assert STRUCTS == wire.C_SIZEOF
    assert wire.SET_TENSOR_HEADER_SIZE == 296 + 1 + 8


def _rpc_source() -> Path | None:
    from pyggml.testing import llamacpp

    path = llamacpp.paths().llama_cpp / "ggml" / "src" / "ggml-rpc" / "ggml-rpc.cpp"
    return path if path.is_file() else None


@pytest.mark.interop
def test_sizes_equal_what_the_c_compiler_says(tmp_path: Path) -> None:
    """The packed block of ggml-rpc.cpp compiled alone (with ggml.h's limits) prints each sizeof."""
    source = _rpc_source()
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if source is None or cxx is None:
        pytest.skip("no llama.cpp source in the cache or no C++ compiler")
    text = source.read_text()
    block = re.search(r"#pragma pack\(push, 1\)(.*?)#pragma pack\(pop\)", text, re.S)
    caps = re.search(r"RPC_CONN_CAPS_SIZE = (\d+)", (source.parent / "transport.h").read_text())
    assert block is not None and caps is not None
    body = re.sub(r"static_assert\(RPC_CMD_HELLO.*?\);", "", block.group(1), flags=re.S)
    prints = "\n".join(f'    printf("{n} %zu\\n", sizeof({n}));' for n in STRUCTS)
    program = (
        "#include <cstdint>\n#include <cstdio>\n#define GGML_MAX_DIMS 4\n#define GGML_MAX_OP_PARAMS 64\n"
        "#define GGML_MAX_SRC 10\n#define GGML_MAX_NAME 64\n"
        f"static constexpr size_t RPC_CONN_CAPS_SIZE = {caps.group(1)};\n"
        f"#pragma pack(push, 1)\n{body}\n#pragma pack(pop)\nint main() {{\n{prints}\n}}\n"
    )
    (tmp_path / "s.cpp").write_text(program)
    subprocess.run([cxx, "-std=c++17", "-o", str(tmp_path / "s"), str(tmp_path / "s.cpp")], check=True,
                   timeout=60)
    out = subprocess.run([str(tmp_path / "s")], check=True, capture_output=True, text=True).stdout
    got = {name: int(size) for name, size in (line.split() for line in out.splitlines())}
    assert got == STRUCTS
    # the command numbers, in the enum's order
    enum = re.search(r"enum rpc_cmd \{(.*?)\};", text, re.S)
    assert enum is not None
    names = re.findall(r"RPC_CMD_(\w+)", enum.group(1))
    assert names == [c.name for c in RpcCmd] + ["COUNT"]
    assert f"RPC_PROTO_MAJOR_VERSION    {wire.RPC_PROTO_MAJOR_VERSION}" in (
        source.parents[2] / "include" / "ggml-rpc.h").read_text()


def test_rpc_tensor_round_trip() -> None:
    t = RpcTensor(id=0x7F0012345678, type=8, buffer=0x55AA, ne=(4096, 32, 1, 1), nb=(34, 4352, 139264, 139264),
                  op=29, op_params=tuple(range(-8, 8)), flags=3, src=tuple(range(1, 11)), view_src=77,
                  view_offs=128, data=0x7F00DEAD0000, name=b"blk.0.attn_q.weight", use_count=2)
    raw = t.pack()
    assert len(raw) == 296
    assert RpcTensor.unpack(raw) == t
    # field offsets as the packed C struct puts them
    assert struct.unpack_from("<Q", raw, 0)[0] == t.id
    assert struct.unpack_from("<I", raw, 8)[0] == 8
    assert struct.unpack_from("<Q", raw, 12)[0] == t.buffer
    assert struct.unpack_from("<4I", raw, 20) == t.ne
    assert struct.unpack_from("<I", raw, 52)[0] == 29
    assert struct.unpack_from("<i", raw, 120)[0] == 3
    assert struct.unpack_from("<Q", raw, 124)[0] == 1
    assert struct.unpack_from("<Q", raw, 220)[0] == t.data
    assert raw[228:247] == b"blk.0.attn_q.weight" and raw[247] == 0
    assert struct.unpack_from("<i", raw, 292)[0] == 2


def test_long_names_keep_the_terminating_nul() -> None:
    raw = RpcTensor(name=b"x" * 100).pack()
    assert raw[228:228 + 63] == b"x" * 63 and raw[228 + 63] == 0
    assert RpcTensor.unpack(raw).name == b"x" * 63


def test_pack_tensor_refuses_what_u32_cannot_carry() -> None:
    params = np.zeros(16, dtype=np.int32)
    ok = wire.pack_tensor(1, 0, 0, [2, 1, 1, 1], [4, 8, 8, 8], 0, params, 0, [0] * 10, 0, 0, 0, "a")
    assert len(ok) == 296
    with pytest.raises(RpcError, match="'big'.*u32"):
        wire.pack_tensor(1, 0, 0, [2**32, 1, 1, 1], [4, 8, 8, 8], 0, params, 0, [0] * 10, 0, 0, 0, "big")


def test_framing() -> None:
    assert wire.frame_request(RpcCmd.DEVICE_COUNT) == bytes([15]) + bytes(8)
    msg = wire.frame_request(RpcCmd.ALLOC_BUFFER, wire.ALLOC_BUFFER_REQ.pack(1, 4096))
    assert msg[0] == 0 and struct.unpack_from("<Q", msg, 1)[0] == 12 and len(msg) == 21
    assert wire.frame_response(b"abc") == struct.pack("<Q", 3) + b"abc"


def test_set_tensor_round_trip() -> None:
    t = RpcTensor(id=5, buffer=9, data=1000, ne=(3, 1, 1, 1), nb=(4, 12, 12, 12))
    payload = wire.pack_set_tensor(t.pack(), 1, 24, b"\x01\x02\x03")
    assert len(payload) == 305 + 3
    got, flag, offset, data = wire.unpack_set_tensor(payload)
    assert (got, flag, offset, bytes(data)) == (t, 1, 24, b"\x01\x02\x03")
    with pytest.raises(RpcError, match="304 bytes.*305"):
        wire.unpack_set_tensor(payload[:304])


def test_graph_round_trip_and_truncations() -> None:
    tensors = [RpcTensor(id=i, op=2, src=(i - 1,) + (0,) * 9) for i in range(1, 4)]
    payload = wire.pack_graph(2, [2, 3], [t.pack() for t in tensors])
    assert len(payload) == 4 + 4 + 16 + 4 + 3 * 296
    assert wire.unpack_graph(payload) == (2, [2, 3], tensors)
    for cut in (0, 7, 20, len(payload) - 1):
        with pytest.raises(RpcError, match="GRAPH_COMPUTE"):
            wire.unpack_graph(payload[:cut])
    with pytest.raises(RpcError, match="GRAPH_COMPUTE"):
        wire.unpack_graph(payload + b"\0")
    # a node count far beyond the payload is refused without allocating for it
    with pytest.raises(RpcError, match="4294967295 nodes"):
        wire.unpack_graph(struct.pack("<II", 0, 2**32 - 1) + bytes(16))


def test_version_rule() -> None:
    wire.check_version(7, 0, 5, "h:1")
    with pytest.raises(wire.RpcVersionError, match=r"h:1 speaks protocol 6\.0\.0"):
        wire.check_version(6, 0, 0, "h:1")
    with pytest.raises(wire.RpcVersionError, match=r"7\.1\.0"):
        wire.check_version(7, 1, 0, "h:1")
    rsp = wire.pack_hello_rsp()
    assert rsp == bytes([7, 0, 0, 0]) + bytes(24)


def test_fnv_hash() -> None:
    assert wire.fnv_hash(b"") == wire.FNV_OFFSET
    assert wire.fnv_hash(b"a") == 0xAF63DC4C8601EC8C  # FNV-1a 64 of "a", the published test vector
    data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    assert wire.fnv_hash(data) == wire.fnv_hash_py(data)
