"""pyggml.capi: ggml's C API by its own names, each a thin call into the classes."""

from pyggml.capi.alloc import *  # noqa: F403
from pyggml.capi.backend import *  # noqa: F403
from pyggml.capi.core import *  # noqa: F403
from pyggml.capi.device import *  # noqa: F403
from pyggml.capi.sched import *  # noqa: F403
