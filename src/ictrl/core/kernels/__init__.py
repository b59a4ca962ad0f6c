"""Fused kernels for the group JS sweep of :mod:`ictrl.core.stats` (core layer: torch, plus triton when present).

- :mod:`ictrl.core.kernels.group_js`: backend choice, the ``torch.compile`` path (CPU: inductor emits one vectorised C++
  loop per block) and the Triton launch (CUDA);
- :mod:`ictrl.core.kernels.group_js_triton`: the hand-written ``@triton.jit`` kernels (split over the vocabulary),
  imported only when triton is.
"""
