"""ggml's RPC protocol (7.0.0, llama.cpp 0c1e570): `wire` (the format), the client backend, the server."""
