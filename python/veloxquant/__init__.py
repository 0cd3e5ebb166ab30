"""VeloxQuant: compressed KV caches for LLM inference, from Python.

Quick start::

    import veloxquant as vq
    model = vq.Model.load()                       # SmolLM2-135M-Instruct (fetched on first use)
    out = model.generate("Why is the sky blue?", kv_cache="vecinfer:d4b8", chat=True)
    print(out.text, out.memory.bits_per_element)

    pq = vq.ProductQuantizer(dim=64, sub_dim=4, bits=8)
    pq.train(x)                                    # x: float32 [n, 64]
    codes = pq.encode(x)                           # uint8 [n, pq.code_size]
    x_hat = pq.decode(codes)                       # float32 [n, 64]

    server = vq.Server(model, vq.KVSpec("vecinfer:d4b8"), port=8080)   # OpenAI-compatible HTTP
    server.run()                                   # until server.stop() (from another thread)

Arrays go in and out as NumPy arrays without copies when they are C-contiguous and of the
documented dtype (others are converted once). Errors raise ``veloxquant.Error`` (a RuntimeError)
with a message naming the field, file or value at fault.
"""

from ._veloxquant import (  # noqa: F401
    Calibration,
    Engine,
    Error,
    Generation,
    KVMemory,
    KVSpec,
    Model,
    PerplexityResult,
    ProductQuantizer,
    Sampler,
    SequenceResult,
    Server,
    Session,
    Tokenizer,
    cuda_available,
    kv_cache_methods,
    kv_cache_spec_help,
    num_threads,
    set_num_threads,
    version,
)

__version__ = version()

__all__ = [
    "Calibration",
    "Engine",
    "Error",
    "Generation",
    "KVMemory",
    "KVSpec",
    "Model",
    "PerplexityResult",
    "ProductQuantizer",
    "Sampler",
    "SequenceResult",
    "Server",
    "Session",
    "Tokenizer",
    "cuda_available",
    "kv_cache_methods",
    "kv_cache_spec_help",
    "num_threads",
    "set_num_threads",
    "version",
]
