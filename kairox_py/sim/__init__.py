"""Trace-driven simulation of the hybrid runtime's neuron cache (`kairox trace`, `kairox simulate`).

Nothing here runs the sparse FFN: decode is recorded once (:mod:`.traces`), then replayed
offline through the balancer policies under a GPU+CPU cost model (:mod:`.replay`), so that
policies and budgets can be compared without a GPU. :mod:`.report` runs the grids and writes
the CSV reports, :mod:`.figures` draws them, :mod:`.sweep` checks the balancer's bar on
synthetic workloads (`scripts/workload_sweep.py`).
"""
