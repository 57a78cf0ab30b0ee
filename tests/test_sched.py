"""The scheduler's copies between host and device memory, without a GPU.

With one GPU, each split layer of the hybrid FFN crosses between the device and the host twice
per token (the FFN input and the next layer's logits to the host, the CPU half's output back).
The scheduler copies both on the device's own queue: reads to the host are all issued before
one wait, writes to the device go from a staging buffer and wait for nothing, so the merge does
not wait for the device half and a layer costs one synchronisation. test-kairox-sched (C++)
checks this against a lazy fake device, which runs queued work only when synchronized and
reads a copy's source then (as a DMA reads pinned memory): a copy read too early or a source
overwritten too soon changes the result. It also checks the scheduler's split timing, which
times a device's splits by its events (the pipeline statistics' device half).
"""
from __future__ import annotations

import subprocess

import pytest

from conftest import find_tool


def test_ordered_host_copies_match_the_cpu_with_one_wait_per_layer() -> None:
    """Every case (one token, a batch, rows larger than the staging's first allocation) gives
    the CPU's result bit for bit with ordered and with synchronous copies; ordered copies wait
    for the device once per layer, synchronous ones also before the CPU half's output goes back.
    With timing on, every split of the last graph is reported, the device's timed by its events
    in the order the device ran them, and the result does not change."""
    exe = find_tool("test-kairox-sched")
    if exe is None:
        pytest.skip("test-kairox-sched not built")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "7/7 passed" in proc.stdout
    assert any(line.startswith("ok split timing") for line in proc.stdout.splitlines())
    ordered = [line for line in proc.stdout.splitlines() if "ordered copies" in line]
    assert len(ordered) == 3 and all(line.startswith("ok ") for line in ordered)
