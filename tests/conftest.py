"""Without a GPU, Triton kernels run in Triton's interpreter (tests/kernels/test_triton.py).

TRITON_INTERPRET=1 has to be set before ``adam8lib.kernels.triton`` is first imported (its
``@triton.jit`` decorators read it), and conftest.py is imported before every test module.
``backend="auto"`` never picks the interpreter, so other tests are unaffected.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
