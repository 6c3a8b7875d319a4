"""GGUF files: reading (memory-mapped, validated), loading tensors into backend buffers, writing."""

from pyggml.gguf.loader import LoadedTensors, load_tensors
from pyggml.gguf.reader import GGUFFile, TensorInfo, read_gguf
from pyggml.gguf.writer import RawTensor, write_gguf

__all__ = ["GGUFFile", "LoadedTensors", "RawTensor", "TensorInfo", "load_tensors", "read_gguf", "write_gguf"]
