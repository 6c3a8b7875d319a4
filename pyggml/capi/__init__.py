"""pyggml.capi: ggml's C API by its own names, each a thin call into the classes."""

from pyggml.capi.alloc import *
from pyggml.capi.backend import *
from pyggml.capi.core import *
from pyggml.capi.device import *
from pyggml.capi.rpc import *
from pyggml.capi.sched import *
