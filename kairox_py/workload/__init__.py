"""Synthetic activation workloads at 7B scale (`kairox workload`).

Per layer and decode step, the active FFN neurons and the predictor's selection, drawn from
a generative model fitted to the papers' published statistics (:mod:`.model`), written in
the trace format of `kairox trace` so that `kairox simulate` replays either (:mod:`.write`);
:mod:`.stats` measures what the papers publish on a workload or a trace, :mod:`.compare`
puts the two side by side, :mod:`.shapes` derives the simulator's costs from a model shape.
docs/workloads.md lists every parameter and the source of each number.
"""
from __future__ import annotations

from .model import PRESETS, Generator, WorkloadParams, resolve
from .stats import Stats, measure
from .write import open_workload, write_workload

__all__ = ["PRESETS", "Generator", "Stats", "WorkloadParams", "measure", "open_workload", "resolve",
           "write_workload"]
