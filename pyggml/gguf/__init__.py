"""GGUF files: reading (memory-mapped, validated), loading tensors into backend buffers, writing."""

from pyggml.gguf.loader import LoadedTensors, load_tensors
from pyggml.gguf.reader import GGUFFile, TensorInfo, read_gguf
from pyggml.gguf.writer import RawTensor, llama_cpp_key_type, write_gguf

__all__ = ["GGUFFile", "LoadedTensors", "RawTensor", "TensorInfo", "llama_cpp_key_type", "load_tensors", "read_gguf",
           "write_gguf"]
