"""The ONNX Runtime session variants ``bench.query_memory`` compares and ``regis.models.inference`` did not keep
(the library's ``OrtBackbone`` makes one session per input shape on the process's shared CPU arena)."""

from __future__ import annotations

import onnxruntime as ort

from regis.models.inference import OrtBackbone, ort_session_options, use_env_allocator


class VariantBackbone(OrtBackbone):
    """``OrtBackbone`` with other sessions.

    Args:
        model, threads: as ``OrtBackbone``.
        dynamic_batch: one session per (height, width), i.e. per backbone pass, with the batch axis left free,
            instead of one per input shape.
        env_allocator: the sessions allocate from the process's shared CPU arena instead of one arena each.
        initializers: name -> ``OrtValue`` given to every session instead of the model's own weights
            (``SessionOptions.add_initializer``, not copied; None: each session loads its own).
    """

    def __init__(self, model: bytes, threads: int, dynamic_batch: bool = False, env_allocator: bool = False,
                 initializers: dict | None = None):
        super().__init__(model, threads)
        self.dynamic_batch, self.env_allocator, self.initializers = dynamic_batch, env_allocator, initializers

    def session(self, shape: tuple[int, ...]):
        """The session for (B, 3, H, W) inputs of this ``shape``; with ``dynamic_batch`` every batch size of
        an (H, W) shares one (its key: batch 0)."""
        return super().session((0, *shape[1:]) if self.dynamic_batch else shape)

    def new_session(self, dims: dict[str, int] | None):
        """A session with this variant's options (``dynamic_batch``: the batch axis left free)."""
        if self.dynamic_batch and dims is not None:
            dims = {k: v for k, v in dims.items() if k != "batch"}
        opts = ort_session_options(self.threads, dims)
        for name, value in (self.initializers or {}).items():
            opts.add_initializer(name, value)
        if self.env_allocator:
            use_env_allocator(opts)
        return ort.InferenceSession(self.model, sess_options=opts, providers=["CPUExecutionProvider"])
