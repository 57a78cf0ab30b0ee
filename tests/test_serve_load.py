"""scripts/serve_load.py end to end: sparse, original and dense llama-server under streaming clients."""
from __future__ import annotations

import csv
import re
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from kairox_py.default_model import model_path


def server_bin() -> Path | None:
    """The llama-server serve_load itself would start (build/dev's, else the one on PATH)."""
    spec = importlib.util.spec_from_file_location("serve_load", REPO / "scripts" / "serve_load.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("serve_load", mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    try:
        return mod.find_server_bin(None)
    except mod.LoadError:
        return None


def cached_kairox_model() -> Path | None:
    """The newest cached Kairox conversion of the default model, or None."""
    plain = model_path()
    found = sorted(plain.parent.glob(f"{plain.stem}.kx-*.gguf"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_serve_load_sparse_original_and_dense(tmp_path: Path) -> None:
    if importlib.util.find_spec("openai") is None:
        pytest.skip("the openai package is not installed (pip install '.[serve]')")
    server = server_bin()
    if server is None:
        pytest.skip("no llama-server: neither build/dev's nor one on PATH")
    model = cached_kairox_model()
    if model is None:
        pytest.skip("no Kairox conversion of the default model is cached (run `kairox run` once)")

    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "scripts" / "serve_load.py"), "--model", str(model),
           "--original", str(model_path()), "--server-bin", str(server), "--modes", "sparse,original,dense",
           "--requests", "8", "--rounds", "2", "--clients", "2,1", "-c", "1024", "-t", "2", "--max-tokens", "16",
           "--cancel-share", "0.25", "--progress-every", "2", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr

    modes = ("sparse", "original", "dense")
    requests = read_csv(out / "requests.csv")
    assert len(requests) == 48, requests
    assert {(r["mode"], r["clients"]) for r in requests} == {(m, n) for m in modes for n in ("1", "2")}
    assert {r["client"] for r in requests if r["clients"] == "1"} == {"0"}
    # two rounds of 4 requests each, numbered on across rounds, every mode the same numbers
    for mode in modes:
        for n in ("1", "2"):
            mine = [r for r in requests if r["mode"] == mode and r["clients"] == n]
            assert sorted(int(r["request"]) for r in mine) == list(range(8)), (mode, n)
            assert {r["round"] for r in mine if int(r["request"]) < 4} == {"0"}, (mode, n)
            assert {r["round"] for r in mine if int(r["request"]) >= 4} == {"1"}, (mode, n)
    for r in requests:
        assert r["status"] in ("ok", "cancelled"), r
        assert int(r["n_tokens"]) > 0, r
        assert float(r["ttft"]) > 0 and float(r["duration"]) >= float(r["ttft"]), r
    for mode in modes:
        statuses = [r["status"] for r in requests if r["mode"] == mode]
        assert "ok" in statuses and "cancelled" in statuses, (mode, statuses)

    rows = read_csv(out / "summary.csv")
    assert [(r["mode"], r["clients"]) for r in rows] == [(m, n) for m in modes for n in ("2", "1")]
    summary = {(r["mode"], r["clients"]): r for r in rows}
    for (mode, n), row in summary.items():
        # every row against the original GGUF at the same client count, in this run (tok_s is
        # rounded to 0.1 and x_base to 0.001, so the ratio of the printed rates is that close)
        mine, base = float(row["tok_s"]), float(summary[("original", n)]["tok_s"])
        slack = mine / base * (0.05 / mine + 0.05 / base) + 0.0005
        assert abs(float(row["x_base"]) - mine / base) <= slack, row
    rounds = read_csv(out / "rounds.csv")
    assert len(rounds) == 12, rounds
    # ABBA: the second round starts the modes in the reverse order
    order = [r["mode"] for r in rounds]
    assert order == [m for m in modes for _ in (2, 1)] + [m for m in modes[::-1] for _ in (2, 1)], order
    for row in rounds:
        assert row["requests"] == "4" and float(row["tok_s"]) > 0, row
    # each mode's summary rate is its tokens over its wall time in both rounds together
    for (mode, n), row in summary.items():
        mine = [r for r in requests if r["mode"] == mode and r["clients"] == n]
        assert int(row["tokens"]) == sum(int(r["n_tokens"]) for r in mine), row
        wall, tokens = float(row["wall_s"]), int(row["tokens"])  # wall_s and tok_s: rounded to 0.1
        assert tokens / (wall + 0.051) - 0.051 <= float(row["tok_s"]) <= tokens / (wall - 0.051) + 0.051, row
    for row in summary.values():
        assert row["rounds"] == "2", row
        assert row["requests"] == "8" and row["failed"] == "0", row
        assert int(row["ok"]) + int(row["cancelled"]) == 8, row
        assert int(row["tokens"]) > 0 and float(row["tok_s"]) > 0, row
        assert float(row["ttft_p50_ms"]) <= float(row["ttft_p99_ms"]), row
        assert float(row["itl_p50_ms"]) > 0, row
        assert float(row["rss_peak_mib"]) > 10, row

    rss = read_csv(out / "rss.csv")
    for mode in modes:
        mine = [float(r["rss_mib"]) for r in rss if r["mode"] == mode]
        assert len(mine) >= 2 and max(mine) > 10, (mode, mine)

    md = (out / "summary.md").read_text()
    assert "| sparse | 2 |" in md and "| original | 1 |" in md and "x_base" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "serve_load.png").stat().st_size > 0

    # every server starts without an error line: upstream's memory-fit pass loads the model
    # without data, which a Kairox GGUF whose ffn_down_t is derived at load must survive
    for mode in modes:
        for r in (0, 1):
            log = (out / f"server-{mode}-r{r}.log").read_text(errors="replace")
            errors = [line for line in log.splitlines() if re.match(r"^\S+ E ", line)]
            assert not errors, (mode, r, errors)


def test_rounds_split_the_load() -> None:
    """--rounds: each round gets its share of the requests, numbered on from the last round's,
    or its share of the duration with request numbers of its own; bad counts are refused."""
    server_bin()  # loads scripts/serve_load.py as the module serve_load
    mod = sys.modules["serve_load"]
    load = mod.LoadConfig((1,), 10, None, 8, 0.1, 0, 30.0, 5.0, "kairox", rounds=3)
    parts = [load.for_round(r) for r in range(3)]
    assert [p.requests for p in parts] == [3, 3, 4]
    assert [p.first_request for p in parts] == [0, 3, 6]
    assert all(p.duration is None for p in parts)
    timed = mod.LoadConfig((1,), None, 90.0, 8, 0.1, 0, 30.0, 5.0, "kairox", rounds=3)
    assert [timed.for_round(r).duration for r in range(3)] == [30.0, 30.0, 30.0]
    assert len({timed.for_round(r).first_request for r in range(3)}) == 3
    single = mod.LoadConfig((1,), 10, None, 8, 0.1, 0, 30.0, 5.0, "kairox")
    assert single.for_round(0) is single
    for argv, msg in ((["--model", "x", "--rounds", "0"], "--rounds must be positive"),
                      (["--model", "x", "--rounds", "3", "--requests", "2"], "at least --rounds"),
                      (["--url", "http://x", "--rounds", "2"], "needs --model"),
                      (["--model", "x", "--rounds", "2", "--soak-window", "60"], "one round")):
        with pytest.raises(mod.LoadError, match=msg):
            mod.check_args(mod.parse_args(argv))
