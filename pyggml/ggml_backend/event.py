"""`Event`: ggml's `ggml_backend_event`, a point in a backend's stream of work that others can wait for.

An event must be recorded on a backend of its own device before it is synchronized or waited on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyggml.core.checks import check_instance
from pyggml.core.errors import ArgumentError, InvalidStateError
from pyggml.ggml_backend.backend import Backend

if TYPE_CHECKING:
    from pyggml.ggml_backend.device import Device


class Event:
    """An event of `device`; `context` is what the device keeps for it (a CUDA event, ...)."""

    def __init__(self, device: Device, context: Any = None) -> None:
        self.device = device
        self.context = context
        self.recorded = False
        self.freed = False

    def _check_alive(self, what: str) -> None:
        if self.freed:
            raise InvalidStateError(f"event of device '{self.device.name()}': {what} after free()")

    def _check_recorded(self, what: str) -> None:
        self._check_alive(what)
        if not self.recorded:
            raise InvalidStateError(f"event of device '{self.device.name()}': {what} before it was recorded")

    def record(self, backend: Backend) -> None:
        """ggml_backend_event_record: the event completes when the work queued on `backend` so far is done."""
        self._check_alive("record")
        check_instance(backend, Backend, "event record: backend")
        backend.check_alive()
        if backend.get_device() is not self.device:
            dev = backend.get_device()
            raise ArgumentError(f"event of device '{self.device.name()}' cannot be recorded on backend "
                                f"'{backend.name()}' (device '{dev.name() if dev is not None else None}')")
        backend._event_record(self)
        self.recorded = True

    def synchronize(self) -> None:
        """ggml_backend_event_synchronize: wait on the host until the recorded work is done."""
        self._check_recorded("synchronize")
        self.device._event_synchronize(self)

    def wait(self, backend: Backend) -> None:
        """ggml_backend_event_wait: `backend` runs its next work only after the recorded work is done."""
        self._check_recorded("wait")
        check_instance(backend, Backend, "event wait: backend")
        backend.check_alive()
        backend._event_wait(self)

    def free(self) -> None:
        """ggml_backend_event_free; freeing twice is harmless."""
        if self.freed:
            return
        self.device._event_free(self)
        self.freed = True

    def __repr__(self) -> str:
        state = "freed" if self.freed else "recorded" if self.recorded else "new"
        return f"Event('{self.device.name()}', {state})"
