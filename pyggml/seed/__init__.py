"""pyggml.seed: the late-2023 ggml (the "seed"), kept as a sealed reference for the seed-exact tests.

pyggml follows one reference, ggml at llama.cpp 0c1e570; everything else in the package is that. This package
holds what the seed did differently, and nothing outside it (but the C API's entry points) imports it:

- `Scheduler` (ggml-backend.c's ggml_backend_sched of late 2023): four assignment passes (memory, sources,
  then sources of sources; no expansion to neighbours, no upgrade to a backend sharing the buffer type, graph
  inputs not put on the last backend, weights not deciding before other sources); fixed limits
  GGML_MAX_BACKENDS = 4, GGML_MAX_SPLITS = 256, GGML_MAX_SPLIT_INPUTS = 16; measure allocators and
  `init_measure(graph)` instead of `reserve`; one copy of each input per split, no pipeline parallelism, no
  events, no graph reuse.
- `Split` (struct ggml_backend_sched_split of late 2023): a run of nodes with its inputs and allocator.
- `assign_backends_seed`: those four passes over the engine's state, for `BackendSched(assign=...)`.
- `Allocr` (the legacy ggml_allocr): one tensor allocator and one graph allocator over the same buffer.
- The C API's two-argument `ggml_backend_sched_new(backends, n_backends)` gives a `Scheduler`
  (`pyggml.seed.capi`, which pyggml.capi.sched calls for that form).
"""

from pyggml.seed.allocr import Allocr
from pyggml.seed.passes import assign_backends_seed
from pyggml.seed.scheduler import GGML_MAX_BACKENDS, GGML_MAX_SPLIT_INPUTS, GGML_MAX_SPLITS, Scheduler
from pyggml.seed.split import Split

__all__ = ["GGML_MAX_BACKENDS", "GGML_MAX_SPLITS", "GGML_MAX_SPLIT_INPUTS", "Allocr", "Scheduler", "Split",
           "assign_backends_seed"]
