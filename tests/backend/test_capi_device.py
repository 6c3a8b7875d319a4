"""Today's ggml-backend.h by its C names (pyggml.capi.device): thin calls, NULL where C returns NULL."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pyggml.capi import device as capi
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy

F32 = GGMLType.F32


def test_every_name_is_there() -> None:
    for name in capi.__all__:
        assert name.startswith(("ggml_backend_", "GGML_BACKEND_")), name
        assert hasattr(capi, name), name


def test_devices_registries_buffer_types_by_their_c_names() -> None:
    cpu = capi.ggml_backend_dev_by_type(capi.GGML_BACKEND_DEVICE_TYPE_CPU)
    assert cpu is not None and capi.ggml_backend_dev_name(cpu) == "CPU"
    assert capi.ggml_backend_dev_by_name("cpu") is cpu and capi.ggml_backend_dev_type(cpu) == 0
    free, total = capi.ggml_backend_dev_memory(cpu)
    props = capi.ggml_backend_dev_get_props(cpu)
    assert isinstance(props, capi.ggml_backend_dev_props) and 0 < free <= total and props.caps.buffer_from_host_ptr
    reg = capi.ggml_backend_dev_backend_reg(cpu)
    assert reg is capi.ggml_backend_cpu_reg() and capi.ggml_backend_reg_name(reg) == "CPU"
    assert capi.ggml_backend_reg_dev_count(reg) == 1 and capi.ggml_backend_reg_dev_get(reg, 0) is cpu
    assert capi.ggml_backend_reg_by_name("CPU") is reg and reg in [capi.ggml_backend_reg_get(i)
                                                                  for i in range(capi.ggml_backend_reg_count())]
    assert cpu in [capi.ggml_backend_dev_get(i) for i in range(capi.ggml_backend_dev_count())]
    assert capi.ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads") is not None
    buft = capi.ggml_backend_dev_buffer_type(cpu)
    assert buft is capi.ggml_backend_cpu_buffer_type() and capi.ggml_backend_buft_name(buft) == "CPU"
    assert capi.ggml_backend_buft_get_alignment(buft) == 64 and capi.ggml_backend_buft_is_host(buft)
    assert capi.ggml_backend_buft_get_max_size(buft) == 2**64 - 1 and capi.ggml_backend_buft_get_device(buft) is cpu
    backend = capi.ggml_backend_dev_init(cpu, None)
    # each CPU backend has a buffer type of its own (so that the scheduler keeps two CPU backends apart, as two
    # devices): named and laid out as the device's, supported by this backend only; the device's serves all
    own = capi.ggml_backend_get_default_buffer_type(backend)
    assert capi.ggml_backend_get_device(backend) is cpu and own is not buft
    assert capi.ggml_backend_buft_name(own) == "CPU" and capi.ggml_backend_buft_is_host(own)
    assert capi.ggml_backend_buft_get_device(own) is cpu and capi.ggml_backend_buft_get_alignment(own) == 64
    other = capi.ggml_backend_dev_init(cpu, None)
    assert capi.ggml_backend_supports_buft(backend, own) and not capi.ggml_backend_supports_buft(other, own)
    assert capi.ggml_backend_supports_buft(backend, buft) and capi.ggml_backend_supports_buft(other, buft)
    assert capi.ggml_backend_dev_supports_buft(cpu, buft) and not capi.ggml_backend_dev_supports_buft(cpu, own)
    assert capi.ggml_backend_get_max_size(backend) == 2**64 - 1
    for b in (capi.ggml_backend_init_by_name("CPU", None), capi.ggml_backend_init_by_type(0, None),
              capi.ggml_backend_init_best()):
        assert b is not None
    assert capi.ggml_backend_event_new(cpu) is None and capi.ggml_backend_event_new(None) is None


def test_null_where_c_returns_null(caplog: pytest.LogCaptureFixture, tmp_path: object) -> None:
    with caplog.at_level(logging.ERROR, logger="pyggml.capi"):
        assert capi.ggml_backend_reg_by_name("vulkan") is None
        assert capi.ggml_backend_dev_by_name("vulkan0") is None
        assert capi.ggml_backend_init_by_name("vulkan0", None) is None
        assert capi.ggml_backend_load("no/such/backend.py") is None
    assert "ggml_backend_load: load: no such file or directory" in caplog.text
    with pytest.raises(ArgumentError):  # a bad argument still raises
        capi.ggml_backend_dev_by_type(42)


def test_buffers_usage_allocation_and_graph_copy_by_their_c_names() -> None:
    cpu = capi.ggml_backend_init_by_type(capi.GGML_BACKEND_DEVICE_TYPE_CPU, None)
    buft = capi.ggml_backend_get_default_buffer_type(cpu)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 10).set_name("a")
    out = ctx.scale(a, 3.0).set_name("out")
    g = ctx.new_graph()
    g.build_forward_expand(out)
    size = capi.ggml_backend_alloc_ctx_tensors_from_buft_size(ctx, buft)
    buf = capi.ggml_backend_alloc_ctx_tensors(ctx, cpu)
    assert buf is not None and capi.ggml_backend_buffer_get_type(buf) is buft and buf.get_size() == size == 128
    assert capi.ggml_backend_buffer_name(buf) == "CPU" and capi.ggml_backend_buffer_is_host(buf)
    assert capi.ggml_backend_buffer_get_usage(buf) == capi.GGML_BACKEND_BUFFER_USAGE_ANY
    capi.ggml_backend_buffer_set_usage(buf, capi.GGML_BACKEND_BUFFER_USAGE_COMPUTE)
    assert capi.ggml_backend_buffer_get_usage(buf) == 2 and capi.ggml_backend_buffer_get_max_size(buf) == 2**64 - 1
    capi.ggml_backend_buffer_reset(buf)
    tensor_set_numpy(a, np.arange(10))
    copy = capi.ggml_backend_graph_copy(capi.ggml_backend_init_by_name("CPU", None), g)
    seen: list[int] = []

    def check(i: int, t1: object, t2: object, user_data: list[int]) -> bool:
        user_data.append(i)
        return True

    assert capi.ggml_backend_compare_graph_backend(cpu, cpu, g, check, seen)
    assert seen == [0]
    cpu.graph_compute(copy.graph)
    np.testing.assert_array_equal(tensor_get_numpy(copy.graph.nodes[0]), np.arange(10) * 3)
    capi.ggml_backend_graph_copy_free(copy)
