"""fp8_stream: the FP8 block-scaled GEMV (+ SwiGLU) that streams weights through a ring of
bulk-copied stages over one resident wave, with stream-K ranges of equal size.

Importing the package registers its spec (cheap: no cutlass import)."""

from mlpjit.kernels.fp8_stream.params import StreamParams
from mlpjit.kernels.fp8_stream.spec import SPEC

__all__ = ["SPEC", "StreamParams"]
