"""`pyggml serve`: an OpenAI-compatible HTTP server over a GGUF model, decoding several requests at once.

    engine = Engine(model, n_slots=4).start()   # the decode loop, in its own thread
    app = create_app(engine, api_key=None)      # a Starlette ASGI app: run it with uvicorn

Needs the `serve` extra (starlette, uvicorn).
"""

from typing import Any

__all__ = ["Engine", "EngineStoppedError", "Event", "GenRequest", "QueueFullError", "ServeError", "create_app"]
_ENGINE_NAMES = frozenset(__all__) - {"create_app"}


def __getattr__(name: str) -> Any:
    """The engine's names, imported on first use (the CLI reads `pyggml.serve.limits` without loading models)."""
    if name in _ENGINE_NAMES:
        from pyggml.serve import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'pyggml.serve' has no attribute {name!r}")


def create_app(*args, **kwargs):  # type: ignore[no-untyped-def]
    """`pyggml.serve.app.create_app`, imported on use (starlette is an optional dependency)."""
    from pyggml.serve.app import create_app as create

    return create(*args, **kwargs)
