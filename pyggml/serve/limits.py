"""The server's bounds on what one client can hold: a body's bytes, the seconds a request's head and body may
take, the connections open at once (defaults of the app, of uvicorn's configuration and of the CLI)."""

MAX_BODY = 1 << 20  # bytes of a request body
HEADER_TIMEOUT = 10.0  # seconds for a request's head, from the connection or the previous answer (then for its body)
MAX_CONNECTIONS = 256  # connections open at once; each may hold a body of up to MAX_BODY
MAX_HEAD = 16 * 1024  # bytes of a request's head (h11's default, made explicit)
BACKLOG = 128  # connections the kernel queues for accept: asyncio accepts up to this many before any is looked at
FD_RESERVE = 64  # file descriptors besides connections (the model, logs, pipes, threads' own)
