"""ONNX Runtime CPU sessions as regis runs them (the service's query copy, ``regis.models.inference``, and the
torch-free query path, ``regis.models.query_bundle``): options tuned for the shared 2-core CPU and one memory
arena shared by every session of the process. Imports neither torch nor (until a session is made) onnxruntime.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()

_env_allocator = False


def use_env_allocator(opts) -> None:
    """Make sessions built with ``opts`` (``onnxruntime.SessionOptions``) allocate from one CPU arena shared in
    the process (ONNX Runtime's environment allocator, registered on first use) instead of an arena each."""
    global _env_allocator
    import onnxruntime as ort

    with _lock:
        if not _env_allocator:
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(info, None)
            _env_allocator = True
    opts.add_session_config_entry("session.use_env_allocators", "1")


def ort_session_options(threads: int, dims: dict[str, int] | None = None):
    """``onnxruntime.SessionOptions`` for a CPU session on ``threads`` intra-op threads (``inference_copy``'s
    thread budget), one inter-op thread, and threads that sleep instead of spinning when idle (the 2-core
    service shares them with decoding and FAISS: docs/benchmarks/history.md, section 6, "Oversubscription").
    ``dims``: values for the model's free dimensions ("batch", "height", "width"), which lets ONNX Runtime plan
    for one input shape.

    Raises:
        ImportError: onnxruntime is not installed.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    for name, value in (dims or {}).items():
        opts.add_free_dimension_override_by_name(name, int(value))
    return opts


def ort_session(model: bytes, threads: int, dims: dict[str, int] | None = None):
    """An ONNX Runtime CPU session of ``model`` with ``ort_session_options(threads, dims)``, allocating from the
    process's shared CPU arena (``use_env_allocator``).

    Raises:
        ImportError: onnxruntime is not installed.
    """
    import onnxruntime as ort

    opts = ort_session_options(threads, dims)
    use_env_allocator(opts)
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
