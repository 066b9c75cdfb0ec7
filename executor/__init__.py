"""Run plans on real layers with torch.distributed, profile layers, compare with the performance model.

Modules: ``layers`` (torch modules per layer kind), ``model`` (builder, stages), ``runtime``
(PyTorch's pipeline runtime + per-action timing), ``launch`` (the torchrun worker), ``replay``
(plan checks, starting torchrun), ``profiler`` and ``fidelity``. See docs/executor.md.
"""

__all__: list[str] = []
