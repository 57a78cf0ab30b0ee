#!/usr/bin/env python3
"""Load test for llama-server: concurrent streaming chat clients, sparse vs dense (issue 37).

    python3 scripts/serve_load.py --model MODEL.kx-XXXX.gguf --original MODEL.gguf \\
        --clients 1,2,4,8 --requests 100 [--modes sparse,original] [--parallel 8] [-c 4096] [-t 2] \\
        [--max-tokens 32] [--cancel-share 0.2] [--server-args "--kx-max-sparse-tokens 8"] \\
        [--out bench-out/serve-load]

    python3 scripts/serve_load.py --url http://127.0.0.1:8080 --clients 8 --requests 200

Why: the Kairox server is meant to serve several users at once, so its sparse FFN has to hold
up under concurrent streaming requests, cancelled requests included, without growing memory.
This tool drives the server through the official ``openai`` client (``pip install
'.[serve]'``) as real chat clients do and measures what users see: time to first token, the
gaps between streamed tokens, throughput per client and in total, and the server's resident
memory over time.

With ``--model`` the tool starts ``llama-server`` itself (``--server-bin``, default
``build/dev/bin/llama-server`` of this repository, README's developer build, else
``llama-server`` on PATH) on a free port, once per mode of ``--modes``, one after the other,
with the same clients and prompts:

* ``sparse``: the model's own Kairox setting (``--kx-mode auto``; a Kairox GGUF runs sparse);
* ``original``: the ORIGINAL GGUF (``--original``) served as llama.cpp serves it, no Kairox
  option: the baseline of every speed claim, and the default second mode when given;
* ``dense``: ``--kx-mode dense`` of the Kairox GGUF (a diagnostic, not a baseline: the converted
  file's dense path is not the original's);
* ``predictor``, ``threshold``, ``cats``, ``auto``: that ``--kx-mode``.

``--clients`` takes one count or a list (``1,2,4,8``): each mode's server then runs the load once
per count, in that order (``--parallel`` defaults to the largest), and every row of the summary
has ``x_base``, its throughput over the baseline mode's (``original``, else ``dense``) at the same
client count, in the same run.

``--rounds R`` splits the requests (or the duration) of every mode and client count into R rounds
and starts a fresh server per mode and round, the modes in turn (ABBA: the order reverses every
round). Each mode's figures then cover R server processes spread over the whole run, so a slow
stretch of the machine or one server's unlucky memory placement weighs on every mode alike;
``rounds.csv`` has each round's throughput and ratio, so their spread shows.

It waits for ``/health``, samples the server's VmRSS (``/proc/PID/status``) every second and
stops the server at the end, on errors and on Ctrl-C. With ``--url`` it drives a running
server instead (one mode, used as a label; no memory samples).

Each client sends the built-in prompts in turn (request i gets prompt i modulo the set) until
``--requests`` requests are done in total or ``--duration`` seconds have passed. A share of
the requests (``--cancel-share``, drawn per request index with ``--seed``, so every mode
cancels the same requests) closes its stream after a random number of chunks; such a request
counts as cancelled, not failed.

Writes under --out:

* ``requests.csv``: one row per request (mode, round, clients, client, request, prompt, start,
  ttft, n_tokens, duration, status, error);
* ``summary.csv``, ``summary.md``: one row per mode and client count: requests ok / failed /
  cancelled, tokens/s in total (and over the baseline's) and per client, TTFT and inter-token
  latency p50/p95/p99, server RSS;
* ``clients.csv``: tokens and tokens/s per mode, client count and client;
* ``rounds.csv`` (``--rounds`` > 1): tokens/s and x_base per round, mode and client count;
* ``rss.csv``: the server's resident memory per second, mode and round (when the tool started it);
* ``server-MODE.log`` (``server-MODE-rROUND.log`` with rounds): the server's output (when the
  tool started it);
* ``serve_load.png``: RSS over time and the latency CDFs (needs matplotlib);
* ``soak.csv``, ``soak.md`` (``--soak-window S``): per run, resident memory at the end against
  the end of the warm-up (``--soak-warmup``), and the p99 inter-token gap of the last window
  against the first after the warm-up; failed requests and slots still busy after the load
  (``/slots``). A 30-minute soak: ``--clients 8 --duration 1800 --soak-window 300``.
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import importlib.util
import json
import math
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SERVER_BIN = REPO / "build" / "dev" / "bin" / "llama-server"

# --modes name -> the server arguments that select it
MODE_ARGS: dict[str, list[str]] = {
    "sparse": ["--kx-mode", "auto"],
    "original": [],  # the --original GGUF, as upstream llama.cpp serves it
    "dense": ["--kx-mode", "dense"],
    "auto": ["--kx-mode", "auto"],
    "predictor": ["--kx-mode", "predictor"],
    "threshold": ["--kx-mode", "threshold"],
    "cats": ["--kx-mode", "cats"],
}

PROMPTS: tuple[str, ...] = (
    "Write a haiku about a lighthouse in winter.",
    "Explain in two sentences why the sky looks blue.",
    "List three uses for a paperclip other than holding paper.",
    "What is the difference between a list and a tuple in Python?",
    "Give me a short recipe for tomato soup.",
    "Translate 'good morning, how are you?' into French.",
    "Summarize the plot of a detective story in one paragraph.",
    "Why do cats purr? Answer briefly.",
    "Write a limerick about a forgetful robot.",
    "What are prime numbers? Give the first five.",
    "Describe a sunrise over the mountains to someone who has never seen one.",
    "How does a bicycle stay upright while moving?",
    "Suggest a name for a bakery that only sells bread made with rye.",
    "Write a polite email declining a meeting invitation.",
    "What is photosynthesis? Explain it to a ten-year-old.",
    "Name four planets of the solar system and one fact about each.",
    "Write the opening line of a science fiction novel.",
    "What should I pack for a weekend hiking trip?",
    "Explain what a hash table is and when to use one.",
    "Tell me a short joke about programmers.",
)

STATUS_OK, STATUS_FAILED, STATUS_CANCELLED = "ok", "failed", "cancelled"


class LoadError(Exception):
    """A problem the user can fix (bad input, unreachable or dead server): reported in one line."""


# ---------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class LoadConfig:
    """What the clients do; the same for every mode."""

    clients: tuple[int, ...]  # client counts, run in this order
    requests: int | None
    duration: float | None
    max_tokens: int
    cancel_share: float
    seed: int
    request_timeout: float
    progress_every: float
    model_name: str
    rounds: int = 1
    first_request: int = 0  # index of this round's first request

    def for_round(self, r: int) -> LoadConfig:
        """The load of round r of `rounds`: its share of the requests or of the duration."""
        if self.rounds == 1:
            return self
        requests = None
        first = r * 1_000_000  # a timed round: its own request numbers (and cancel draws)
        if self.requests is not None:
            first = self.requests * r // self.rounds
            requests = self.requests * (r + 1) // self.rounds - first
        duration = self.duration / self.rounds if self.duration is not None else None
        return replace(self, requests=requests, duration=duration, first_request=first)


@dataclass(frozen=True)
class ServerConfig:
    """How the tool starts llama-server."""

    binary: Path
    model: Path
    original: Path | None  # the model of mode "original"
    parallel: int
    ctx: int
    threads: int
    extra_args: tuple[str, ...]
    start_timeout: float


# ---------------------------------------------------------------------------- results


@dataclass
class RequestResult:
    mode: str
    clients: int  # concurrent clients of the load it belongs to
    client: int
    request: int
    prompt: int
    start: float  # seconds since the mode's load began
    ttft: float | None  # seconds to the first content chunk
    n_tokens: int
    duration: float
    status: str
    error: str = ""
    gaps: list[float] = field(default_factory=list)  # seconds between content chunks


@dataclass
class ModeRun:
    mode: str
    clients: int
    wall: float
    results: list[RequestResult]
    rss: list[tuple[float, float]]  # its server's samples, shared by the runs of one server:
    # (seconds since server start, MiB)
    rss_load_start: float | None  # seconds since server start when this run's load began
    rss_load_end: float | None  # ... and when it ended
    busy_slots: int | None = None  # slots still processing after the load (None: not known)
    round: int = 0  # --rounds: which round (one server start per mode and round)


class Collector:
    """Thread-safe store of finished requests, read by the progress line."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: list[RequestResult] = []

    def add(self, result: RequestResult) -> None:
        with self._lock:
            self._results.append(result)

    def snapshot(self) -> list[RequestResult]:
        with self._lock:
            return list(self._results)


class Budget:
    """Hands out request indices until --requests are given out, --duration passes or stop."""

    def __init__(self, total: int | None, deadline: float | None, stop: threading.Event, first: int = 0) -> None:
        self._lock = threading.Lock()
        self._next = first  # a later round continues the request numbering (and its cancel draws)
        self._total = None if total is None else first + total
        self._deadline = deadline
        self._stop = stop

    def take(self) -> int | None:
        if self._stop.is_set() or (self._deadline is not None and time.monotonic() >= self._deadline):
            return None
        with self._lock:
            if self._total is not None and self._next >= self._total:
                return None
            index = self._next
            self._next += 1
            return index


# ---------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1000:.1f}"


def fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def client_rates(rounds: Sequence[ModeRun]) -> list[tuple[int, int, int, float]]:
    """(client, requests, tokens, tokens/s over the wall time) per client, over the rounds of
    one mode and client count."""
    wall = sum(run.wall for run in rounds)
    rows = []
    for c in range(rounds[0].clients):
        mine = [r for run in rounds for r in run.results if r.client == c]
        tokens = sum(r.n_tokens for r in mine)
        rows.append((c, len(mine), tokens, tokens / wall if wall > 0 else 0.0))
    return rows


def run_rate(rounds: Sequence[ModeRun]) -> float:
    """Aggregate tokens per second of runs together: all their tokens over all their wall time."""
    wall = sum(run.wall for run in rounds)
    return sum(r.n_tokens for run in rounds for r in run.results) / wall if wall > 0 else 0.0


def summarize(rounds: Sequence[ModeRun], base: Sequence[ModeRun] | None) -> dict[str, str]:
    """One summary row for the rounds of one mode and client count, as strings ready for CSV
    and Markdown; base: the baseline mode's rounds at the same client count (None: no baseline
    in this run)."""
    run = rounds[0]
    res = [r for one in rounds for r in one.results]
    wall = sum(one.wall for one in rounds)
    count = {s: sum(r.status == s for r in res) for s in (STATUS_OK, STATUS_FAILED, STATUS_CANCELLED)}
    tokens = sum(r.n_tokens for r in res)
    ttfts = [r.ttft for r in res if r.ttft is not None]
    gaps = [g for r in res for g in r.gaps]
    per_client = [rate for _, _, _, rate in client_rates(rounds)]
    in_load = [mib for one in rounds for t, mib in load_samples(one)]
    last_load = load_samples(rounds[-1])
    before = [mib for t, mib in run.rss if run.rss_load_start is not None and t < run.rss_load_start]
    busy = [one.busy_slots for one in rounds if one.busy_slots is not None]
    return {
        "mode": run.mode,
        "clients": str(run.clients),
        "rounds": str(len(rounds)),
        "requests": str(len(res)),
        "ok": str(count[STATUS_OK]),
        "failed": str(count[STATUS_FAILED]),
        "cancelled": str(count[STATUS_CANCELLED]),
        "wall_s": fmt(wall),
        "tokens": str(tokens),
        "tok_s": fmt(tokens / wall if wall > 0 else None),
        "x_base": fmt(run_rate(rounds) / run_rate(base), 3) if base and run_rate(base) > 0 else "",
        "tok_s_client_min": fmt(min(per_client, default=None)),
        "tok_s_client_mean": fmt(sum(per_client) / len(per_client) if per_client else None),
        "tok_s_client_max": fmt(max(per_client, default=None)),
        "ttft_p50_ms": ms(percentile(ttfts, 50)),
        "ttft_p95_ms": ms(percentile(ttfts, 95)),
        "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "itl_p50_ms": ms(percentile(gaps, 50)),
        "itl_p95_ms": ms(percentile(gaps, 95)),
        "itl_p99_ms": ms(percentile(gaps, 99)),
        "rss_idle_mib": fmt(before[-1] if before else None),
        "rss_peak_mib": fmt(max(in_load, default=None)),
        "rss_end_mib": fmt(last_load[-1][1] if last_load else None),
        "busy_slots_after": str(max(busy)) if busy else "",
    }


def load_samples(run: ModeRun) -> list[tuple[float, float]]:
    """The server's RSS samples taken during this run's load."""
    lo = run.rss_load_start if run.rss_load_start is not None else -math.inf
    hi = run.rss_load_end if run.rss_load_end is not None else math.inf
    return [(t, mib) for t, mib in run.rss if lo <= t <= hi]


def soak_stats(run: ModeRun, warmup: float, window: float) -> dict[str, str]:
    """A long run's stability after `warmup` seconds: resident memory at the end against the
    end of the warm-up (drift), and the p99 gap between streamed tokens of the requests that
    started in the first `window` seconds after the warm-up against those of the last."""
    end = max((r.start + r.duration for r in run.results), default=0.0)
    after = [(t - (run.rss_load_start or 0.0), mib) for t, mib in load_samples(run)]
    at_warm = [mib for t, mib in after if t <= warmup]
    rss_warm = at_warm[-1] if at_warm else None
    rss_end = after[-1][1] if after else None
    rss_peak = max((mib for t, mib in after if t > warmup), default=None)
    first = [g for r in run.results if warmup <= r.start < warmup + window for g in r.gaps]
    last = [g for r in run.results if r.start >= max(warmup, end - window) for g in r.gaps]
    p_first, p_last = percentile(first, 99), percentile(last, 99)
    drift = (rss_end - rss_warm) / rss_warm if rss_warm and rss_end is not None else None
    ratio = p_last / p_first if p_first and p_last is not None else None
    failed = sum(r.status == STATUS_FAILED for r in run.results)
    ok = (failed == 0 and run.busy_slots in (0, None) and drift is not None and abs(drift) < 0.05
          and ratio is not None and ratio <= 1.2)
    return {"mode": run.mode, "clients": str(run.clients), "duration_s": fmt(run.wall),
            "requests": str(len(run.results)), "failed": str(failed),
            "busy_slots_after": "" if run.busy_slots is None else str(run.busy_slots),
            "rss_after_warmup_mib": fmt(rss_warm), "rss_peak_mib": fmt(rss_peak), "rss_end_mib": fmt(rss_end),
            "rss_drift_pct": fmt(None if drift is None else 100 * drift, 2),
            "itl_p99_first_ms": ms(p_first), "itl_p99_last_ms": ms(p_last),
            "itl_p99_last_over_first": fmt(ratio, 3), "stable": "yes" if ok else "no"}


# ---------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_server_bin(requested: str | None) -> Path:
    if requested:
        path = Path(requested)
        found = path if path.exists() else (Path(p) if (p := shutil.which(requested)) else None)
        if found is None:
            raise LoadError(f"server binary not found: {requested}")
        return found
    if DEFAULT_SERVER_BIN.exists():
        return DEFAULT_SERVER_BIN
    on_path = shutil.which("llama-server")
    if on_path is None:
        raise LoadError(f"no llama-server: neither {DEFAULT_SERVER_BIN} nor one on PATH; give --server-bin")
    return Path(on_path)


def die_with_parent() -> None:
    """In the child before exec: the kernel kills the server when this tool dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def health(url: str, timeout: float = 2.0) -> tuple[int | None, str]:
    """The /health status code and body; (None, reason) when nothing answers."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return None, str(getattr(e, "reason", e))


def busy_slots(url: str, settle: float = 10.0) -> int | None:
    """Slots still processing a request once the load is over (GET /slots), after up to
    `settle` seconds for cancelled streams to be noticed; None when the server has no /slots."""
    deadline = time.monotonic() + settle
    while True:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/slots", timeout=5) as resp:
                slots = json.loads(resp.read().decode())
        except (urllib.error.URLError, OSError, ValueError):
            return None
        busy = sum(1 for sl in slots if isinstance(sl, dict) and sl.get("is_processing"))
        if busy == 0 or time.monotonic() >= deadline:
            return busy
        time.sleep(0.5)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in text[-lines:])


def wait_healthy(url: str, timeout: float, proc: subprocess.Popen[bytes] | None, log: Path | None) -> None:
    """Polls /health until it answers 200; fails when the server exits or the time is up."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log_tail(log) if log else ""
            raise LoadError(f"the server exited at start with code {proc.returncode}"
                            + (f"; the end of {log}:\n{tail}" if tail else ""))
        code, body = health(url)
        if code == 200:
            return
        if code is None and proc is None:
            raise LoadError(f"no server answers at {url}: {body}")
        last = f"HTTP {code}: {body.strip()}" if code is not None else body
        time.sleep(0.25)
    raise LoadError(f"{url}/health did not answer ok within {timeout:.0f} s (last: {last})")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL when the server does not exit in time."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


@contextmanager
def running_server(cfg: ServerConfig, mode: str, out: Path,
                   label: str = "") -> Iterator[tuple[str, subprocess.Popen[bytes], Path, RssSampler]]:
    """Starts llama-server for a mode and its RSS sampler, waits for /health, yields (url,
    process, log, sampler), stops both; label: the log name's suffix (the round)."""
    port = free_port()
    log = out / f"server-{mode}{label}.log"
    model = cfg.original if mode == "original" else cfg.model
    assert model is not None
    cmd = [str(cfg.binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--parallel", str(cfg.parallel), "-c", str(cfg.ctx), "-t", str(cfg.threads),
           *MODE_ARGS[mode], *cfg.extra_args]
    with open(log, "wb") as log_file:
        log_file.write(("$ " + shlex.join(cmd) + "\n").encode())
        log_file.flush()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=die_with_parent)
        except OSError as e:
            raise LoadError(f"cannot start {cfg.binary}: {e}") from None
    sampler = RssSampler(proc.pid).start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, cfg.start_timeout, proc, log)
        yield url, proc, log, sampler
    finally:
        sampler.stop()
        stop_server(proc)


def read_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


class RssSampler:
    """Samples a process's VmRSS every `interval` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        self._pid = pid
        self._interval = interval
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._samples: list[tuple[float, float]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def sample(self) -> None:
        mib = read_rss_mib(self._pid)
        if mib is not None:
            with self._lock:
                self._samples.append((self.elapsed(), mib))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def stop(self) -> list[tuple[float, float]]:
        """Stops sampling (once; later calls only return the samples), with a last sample."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=5)
            self.sample()
        with self._lock:
            return list(self._samples)


# ---------------------------------------------------------------------------- clients


def cancel_after(index: int, cfg: LoadConfig) -> int | None:
    """The chunk count after which request `index` closes its stream, or None: the same per
    index in every mode."""
    rng = random.Random(cfg.seed * 1_000_003 + index)
    if rng.random() >= cfg.cancel_share:
        return None
    return rng.randint(1, max(1, cfg.max_tokens - 1))


def short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text[:200]


def one_request(client: Any, mode: str, clients: int, cid: int, index: int, cfg: LoadConfig, t0: float,
                stop: threading.Event) -> RequestResult:
    """Sends one streaming chat request and times its chunks."""
    prompt = index % len(PROMPTS)
    limit = cancel_after(index, cfg)
    start = time.monotonic()
    result = RequestResult(mode, clients, cid, index, prompt, start - t0, None, 0, 0.0, STATUS_OK)
    chunks = 0
    usage_tokens: int | None = None
    last: float | None = None
    stream = None
    try:
        stream = client.chat.completions.create(
            model=cfg.model_name, messages=[{"role": "user", "content": PROMPTS[prompt]}],
            stream=True, max_tokens=cfg.max_tokens, temperature=0, seed=cfg.seed,
            stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                usage_tokens = chunk.usage.completion_tokens
            if not any(c.delta is not None and c.delta.content for c in chunk.choices):
                continue
            now = time.monotonic()
            if last is None:
                result.ttft = now - start
            else:
                result.gaps.append(now - last)
            last = now
            chunks += 1
            if (limit is not None and chunks >= limit) or stop.is_set():
                result.status = STATUS_CANCELLED
                break
    except Exception as e:  # any client or server error is a failed request, not a crash
        result.status = STATUS_FAILED
        result.error = short_error(e)
    finally:
        if stream is not None:
            try:
                stream.close()
            except Exception:  # closing a broken connection may raise; the request is over
                pass
    result.n_tokens = usage_tokens if result.status == STATUS_OK and usage_tokens is not None else chunks
    result.duration = time.monotonic() - start
    return result


def client_loop(url: str, mode: str, clients: int, cid: int, cfg: LoadConfig, budget: Budget, sink: Collector,
                t0: float, stop: threading.Event) -> None:
    import openai

    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none",
                           timeout=cfg.request_timeout, max_retries=0)
    try:
        while (index := budget.take()) is not None:
            sink.add(one_request(client, mode, clients, cid, index, cfg, t0, stop))
    finally:
        client.close()


def progress_line(mode: str, elapsed: float, results: list[RequestResult]) -> str:
    tokens = sum(r.n_tokens for r in results)
    count = {s: sum(r.status == s for r in results) for s in (STATUS_OK, STATUS_FAILED, STATUS_CANCELLED)}
    rate = tokens / elapsed if elapsed > 0 else 0.0
    return (f"[{mode}] {elapsed:6.1f} s  requests {len(results)} (ok {count[STATUS_OK]}, "
            f"failed {count[STATUS_FAILED]}, cancelled {count[STATUS_CANCELLED]})  {rate:.1f} tok/s")


def run_load(url: str, mode: str, clients: int, cfg: LoadConfig, server: subprocess.Popen[bytes] | None,
             log: Path | None) -> tuple[float, list[RequestResult]]:
    """Runs `clients` clients against a healthy server; returns (wall seconds, results)."""
    stop = threading.Event()
    sink = Collector()
    t0 = time.monotonic()
    deadline = t0 + cfg.duration if cfg.duration is not None else None
    budget = Budget(cfg.requests, deadline, stop, cfg.first_request)
    threads = [threading.Thread(target=client_loop, args=(url, mode, clients, c, cfg, budget, sink, t0, stop),
                                name=f"client-{c}", daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    next_line = t0 + cfg.progress_every
    try:
        while alive := [t for t in threads if t.is_alive()]:
            alive[0].join(timeout=0.2)
            if server is not None and server.poll() is not None:
                tail = log_tail(log) if log else ""
                raise LoadError(f"the server exited during the load with code {server.returncode}"
                                + (f"; the end of {log}:\n{tail}" if tail else ""))
            if time.monotonic() >= next_line:
                print(progress_line(f"{mode} x{clients}", time.monotonic() - t0, sink.snapshot()), flush=True)
                next_line += cfg.progress_every
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=cfg.request_timeout)
    wall = time.monotonic() - t0
    results = sorted(sink.snapshot(), key=lambda r: r.request)
    print(progress_line(f"{mode} x{clients}", wall, results) + "  done", flush=True)
    return wall, results


def run_mode(mode: str, load: LoadConfig, server_cfg: ServerConfig | None, url: str | None,
             out: Path, round_: int = 0) -> list[ModeRun]:
    """One server for the mode (or the running --url), the load once per client count."""
    if server_cfg is None:
        assert url is not None
        wait_healthy(url, 30.0, None, None)
        runs = []
        for n in load.clients:
            wall, results = run_load(url, mode, n, load, None, None)
            runs.append(ModeRun(mode, n, wall, results, [], None, None, round=round_))
        return runs
    label = f"-r{round_}" if load.rounds > 1 else ""
    print(f"[{mode}{label}] starting {server_cfg.binary.name} "
          f"({shlex.join(MODE_ARGS[mode]) or 'no Kairox option'})", flush=True)
    spans: list[tuple[int, float, list[RequestResult], float, float]] = []
    busy: dict[int, int | None] = {}
    with running_server(server_cfg, mode, out, label) as (server_url, proc, log, sampler):
        sampler.sample()  # the idle server, just before the load
        for n in load.clients:
            start = sampler.elapsed()
            wall, results = run_load(server_url, mode, n, load, proc, log)
            sampler.sample()  # the load's end: a load shorter than the interval still has one
            busy[n] = busy_slots(server_url)
            spans.append((n, wall, results, start, sampler.elapsed()))
            failed = [r for r in results if r.status == STATUS_FAILED]
            if failed:
                print(f"[{mode} x{n}] {len(failed)} failed requests, first: {failed[0].error} "
                      f"(server log: {log})", file=sys.stderr)
        rss = sampler.stop()
    return [ModeRun(mode, n, wall, results, rss, start, end, busy[n], round_)
            for n, wall, results, start, end in spans]


# ---------------------------------------------------------------------------- output


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def write_requests(path: Path, runs: Sequence[ModeRun]) -> None:
    header = ["mode", "round", "clients", "client", "request", "prompt", "start", "ttft", "n_tokens", "duration",
              "status", "error"]
    rows = [[r.mode, run.round, r.clients, r.client, r.request, r.prompt, f"{r.start:.4f}",
             "" if r.ttft is None else f"{r.ttft:.4f}", r.n_tokens, f"{r.duration:.4f}", r.status, r.error]
            for run in runs for r in run.results]
    write_csv(path, header, rows)


def server_runs(runs: Sequence[ModeRun]) -> dict[tuple[str, int], list[ModeRun]]:
    """The runs of each server start (mode, round), in order."""
    by: dict[tuple[str, int], list[ModeRun]] = {}
    for run in runs:
        by.setdefault((run.mode, run.round), []).append(run)
    return by


def merged_runs(runs: Sequence[ModeRun]) -> list[list[ModeRun]]:
    """The rounds of each (mode, client count), in first-run order."""
    by: dict[tuple[str, int], list[ModeRun]] = {}
    for run in runs:
        by.setdefault((run.mode, run.clients), []).append(run)
    return list(by.values())


def write_rss(path: Path, runs: Sequence[ModeRun]) -> None:
    """Each server's samples, phase = the client count whose load was running."""
    rows = []
    for (mode, round_), mine in server_runs(runs).items():
        for t, mib in mine[0].rss:
            phase = "start"
            for run in mine:
                if run.rss_load_start is not None and t >= run.rss_load_start:
                    phase = f"load x{run.clients}"
            rows.append([mode, round_, f"{t:.2f}", f"{mib:.1f}", phase])
    write_csv(path, ["mode", "round", "t_s", "rss_mib", "phase"], rows)


def baseline_mode(runs: Sequence[ModeRun]) -> str | None:
    """The mode every row is compared with: the original GGUF, else the converted file's dense."""
    modes = {run.mode for run in runs}
    return next((m for m in ("original", "dense") if m in modes), None)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_summaries(out: Path, runs: Sequence[ModeRun], load: LoadConfig, target: str, argv: Sequence[str]) -> str:
    """Writes summary.csv, summary.md and clients.csv; returns the summary's Markdown table."""
    base_mode = baseline_mode(runs)
    groups = merged_runs(runs)
    base = {group[0].clients: group for group in groups if group[0].mode == base_mode}
    summary = [summarize(group, base.get(group[0].clients)) for group in groups]
    header = list(summary[0].keys())
    write_csv(out / "summary.csv", header, [[row[k] for k in header] for row in summary])
    clients = [[group[0].mode, str(group[0].clients), str(c), str(n), str(tok), f"{rate:.1f}"]
               for group in groups for c, n, tok, rate in client_rates(group)]
    client_header = ["mode", "clients", "client", "requests", "tokens", "tok_s"]
    write_csv(out / "clients.csv", client_header, clients)
    table = markdown_table(header, [[row[k] for k in header] for row in summary])
    limit = f"{load.requests} requests" if load.requests is not None else ""
    if load.duration is not None:
        limit += (" or " if limit else "") + f"{load.duration:g} s"
    if load.rounds > 1:
        limit += f" in {load.rounds} rounds (a fresh server per mode and round, the order reversed every round)"
    text = (f"# serve_load\n\n`{shlex.join(['python3', 'scripts/serve_load.py', *argv])}`\n\n"
            f"Target: {target}. {', '.join(map(str, load.clients))} streaming clients, {limit} per mode "
            f"and client count, max_tokens {load.max_tokens}, cancel share {load.cancel_share:g}, "
            "temperature 0.\n\n"
            "tok_s: tokens of every request (cancelled ones up to their cancel) per second of wall time; "
            + (f"x_base: tok_s over mode {base_mode}'s at the same client count; " if base_mode else "") +
            "tok_s_client_*: per client; ttft: time to the first content chunk; itl: gaps between "
            "content chunks; rss_idle: the server's resident memory before the load, rss_peak/end: "
            "during it.\n\n"
            f"{table}\n\n## Per client\n\n{markdown_table(client_header, clients)}\n")
    if load.rounds > 1:
        text += f"\n## Per round\n\n{write_rounds(out / 'rounds.csv', runs, base_mode)}\n"
    (out / "summary.md").write_text(text)
    return table


def write_rounds(path: Path, runs: Sequence[ModeRun], base_mode: str | None) -> str:
    """rounds.csv: each round's tokens/s and ratio to the baseline's same round; returns it as
    a Markdown table."""
    base = {(run.round, run.clients): run for run in runs if run.mode == base_mode}
    header = ["mode", "round", "clients", "requests", "tok_s", "x_base"]
    rows = []
    for run in runs:
        other = base.get((run.round, run.clients))
        rate = run_rate([run])
        rows.append([run.mode, str(run.round), str(run.clients), str(len(run.results)), fmt(rate),
                     fmt(rate / run_rate([other]), 3) if other is not None and run_rate([other]) > 0 else ""])
    write_csv(path, header, rows)
    return markdown_table(header, rows)


def write_soak(out: Path, runs: Sequence[ModeRun], warmup: float, window: float) -> str:
    """soak.csv and soak.md: every run's stability after the warm-up; returns the table."""
    rows = [soak_stats(run, warmup, window) for run in runs]
    header = list(rows[0].keys())
    write_csv(out / "soak.csv", header, [[r[k] for k in header] for r in rows])
    table = markdown_table(header, [[r[k] for k in header] for r in rows])
    (out / "soak.md").write_text(
        f"# serve_load soak\n\nWarm-up {warmup:g} s, windows of {window:g} s. Stable: no failed request, "
        "no slot still processing after the load, resident memory at the end within 5% of the "
        "end of the warm-up, and the p99 inter-token gap of the requests started in the last "
        "window at most 1.2x that of the first window after the warm-up.\n\n" + table + "\n")
    return table


def write_plot(path: Path, runs: Sequence[ModeRun]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        print("warning: matplotlib is missing; no serve_load.png (pip install matplotlib)", file=sys.stderr)
        return
    with_rss = any(run.rss for run in runs)
    fig, axes = plt.subplots(1, 3 if with_rss else 2, figsize=(15 if with_rss else 10, 4))
    ax_ttft, ax_itl = axes[-2], axes[-1]
    if with_rss:
        several = len({run.round for run in runs}) > 1
        for (mode, round_), mine in server_runs(runs).items():
            axes[0].plot([t for t, _ in mine[0].rss], [m for _, m in mine[0].rss],
                         label=f"{mode} r{round_}" if several else mode)
            for run in mine:
                if run.rss_load_start is not None:
                    axes[0].axvline(run.rss_load_start, color="grey", lw=0.5, ls=":")
        axes[0].set(title="server RSS", xlabel="s since server start", ylabel="MiB")
        axes[0].legend()
    for group in merged_runs(runs):
        res = [r for run in group for r in run.results]
        for ax, values in ((ax_ttft, [r.ttft for r in res if r.ttft is not None]),
                           (ax_itl, [g for r in res for g in r.gaps])):
            if values:
                xs = sorted(v * 1000 for v in values)
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{group[0].mode} x{group[0].clients}")
    ax_ttft.set(title="time to first token (CDF)", xlabel="ms", ylabel="share of requests")
    ax_itl.set(title="inter-token latency (CDF)", xlabel="ms", ylabel="share of gaps")
    for ax in (ax_ttft, ax_itl):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--model", help="GGUF to serve: the tool starts llama-server on it, once per mode")
    p.add_argument("--original", help="the original GGUF the Kairox GGUF was converted from: mode `original` "
                                      "serves it as upstream does (the baseline of x_base)")
    target.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8080")
    p.add_argument("--server-bin", help=f"llama-server binary (default: {DEFAULT_SERVER_BIN.relative_to(REPO)} "
                                        "of this repository, else llama-server on PATH)")
    p.add_argument("--modes", help="comma-separated modes, one server start each: "
                                   f"{', '.join(MODE_ARGS)} (default: sparse,original with --original, else "
                                   "sparse,dense; with --url one label, default: server)")
    p.add_argument("--parallel", type=int, default=None, help="server slots (default: the most --clients)")
    p.add_argument("-c", "--ctx", type=int, default=4096, help="server context, all slots together (default: 4096)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1, help="server threads (default: all cores)")
    p.add_argument("--load-mode", default="none",
                   help="llama-server --load-mode for every mode (default: none, weights read into the "
                        "server's buffers as `kairox run` reads them: the sparse kernels read rows at "
                        "random, which huge-page buffers serve faster than a file map; the same for the "
                        "original, so that both are served alike); 'auto' is upstream's default, the map")
    p.add_argument("--server-args", default="", help="extra llama-server arguments, one shell-quoted string")
    p.add_argument("--start-timeout", type=float, default=120.0, help="seconds to wait for /health (default: 120)")
    p.add_argument("--clients", default="4", help="concurrent streaming clients, or a comma-separated list of "
                                                  "counts run one after the other (default: 4)")
    p.add_argument("--requests", type=int, help="requests in total per mode and client count")
    p.add_argument("--duration", type=float, help="seconds of load per mode and client count (default: 30 when "
                                                  "--requests is not given)")
    p.add_argument("--rounds", type=int, default=1,
                   help="split each mode's requests (or duration) into this many rounds, a fresh server per "
                        "mode and round, the modes in turn, the order reversed every round (default: 1)")
    p.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default: 32)")
    p.add_argument("--cancel-share", type=float, default=0.2, help="share of requests cancelled mid-stream (default: 0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed for the cancel draws and the sampler (default: 0)")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request (default: 120)")
    p.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines (default: 5)")
    p.add_argument("--model-name", default="kairox", help="the `model` field of the requests (default: kairox)")
    p.add_argument("--soak-window", type=float, default=None,
                   help="also write soak.csv/soak.md: stability with windows of this many seconds")
    p.add_argument("--soak-warmup", type=float, default=300.0,
                   help="seconds of the load not judged by the soak (default: 300)")
    p.add_argument("--out", default=str(REPO / "bench-out" / "serve-load"), help="output folder (default: bench-out/serve-load)")
    return p.parse_args(argv)


def parse_clients(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise LoadError(f"--clients must be a count or a comma-separated list of counts, not {text!r}") from None
    if not counts or any(n <= 0 for n in counts):
        raise LoadError(f"--clients must be positive counts, not {text!r}")
    return counts


def check_args(args: argparse.Namespace) -> None:
    args.clients = parse_clients(args.clients)
    if args.parallel is None:
        args.parallel = max(args.clients)
    if args.original and args.url:
        raise LoadError("--original needs --model (the tool starts both servers)")
    positive = {"--parallel": args.parallel, "--ctx": args.ctx, "--threads": args.threads,
                "--max-tokens": args.max_tokens,
                "--start-timeout": args.start_timeout, "--request-timeout": args.request_timeout,
                "--progress-every": args.progress_every}
    for name, value in positive.items():
        if value <= 0:
            raise LoadError(f"{name} must be positive, not {value}")
    if args.requests is not None and args.requests <= 0:
        raise LoadError(f"--requests must be positive, not {args.requests}")
    if args.duration is not None and args.duration <= 0:
        raise LoadError(f"--duration must be positive, not {args.duration}")
    if args.rounds <= 0:
        raise LoadError(f"--rounds must be positive, not {args.rounds}")
    if args.rounds > 1 and args.url:
        raise LoadError("--rounds restarts the servers: it needs --model")
    if args.rounds > 1 and args.soak_window:
        raise LoadError("--rounds splits the load: a soak (--soak-window) needs one round")
    if args.requests is not None and args.requests < args.rounds:
        raise LoadError(f"--requests ({args.requests}) must be at least --rounds ({args.rounds})")
    if not 0.0 <= args.cancel_share <= 1.0:
        raise LoadError(f"--cancel-share must be in [0, 1], not {args.cancel_share}")


def parse_modes(args: argparse.Namespace) -> list[str]:
    if args.url:
        modes = [m.strip() for m in (args.modes or "server").split(",") if m.strip()]
        if len(modes) != 1:
            raise LoadError("--url drives one running server: give one --modes label at most")
        return modes
    default = "sparse,original" if args.original else "sparse,dense"
    modes = [m.strip() for m in (args.modes or default).split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODE_ARGS]
    if unknown or not modes:
        raise LoadError(f"unknown mode(s) {', '.join(unknown) or '(none)'}; known: {', '.join(MODE_ARGS)}")
    if len(set(modes)) != len(modes):
        raise LoadError("--modes names a mode twice")
    if "original" in modes and not args.original:
        raise LoadError("mode original needs --original ORIGINAL.gguf")
    return modes


def server_config(args: argparse.Namespace) -> ServerConfig:
    model = Path(args.model).expanduser()
    if not model.is_file():
        raise LoadError(f"model not found: {model}")
    original = Path(args.original).expanduser() if args.original else None
    if original is not None and not original.is_file():
        raise LoadError(f"original model not found: {original}")
    try:
        extra = tuple(shlex.split(args.server_args))
    except ValueError as e:
        raise LoadError(f"--server-args: {e}") from None
    if not any(a in ("-lm", "--load-mode") or a.startswith("--load-mode=") for a in extra):
        extra = ("--load-mode", args.load_mode, *extra)
    return ServerConfig(find_server_bin(args.server_bin), model.resolve(),
                        original.resolve() if original else None, args.parallel, args.ctx,
                        args.threads, extra, args.start_timeout)


def load_config(args: argparse.Namespace) -> LoadConfig:
    duration = args.duration if args.duration is not None or args.requests is not None else 30.0
    return LoadConfig(args.clients, args.requests, duration, args.max_tokens, args.cancel_share,
                      args.seed, args.request_timeout, args.progress_every, args.model_name, args.rounds)


def raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        check_args(args)
        if importlib.util.find_spec("openai") is None:
            raise LoadError("the openai package is missing: pip install 'openai>=1.0' (or '.[serve]')")
        modes = parse_modes(args)
        server_cfg = server_config(args) if args.model else None
        load = load_config(args)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        runs = []
        for r in range(load.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                runs += run_mode(mode, load.for_round(r), server_cfg, args.url, out, r)
        write_requests(out / "requests.csv", runs)
        if server_cfg is not None:
            write_rss(out / "rss.csv", runs)
        target = args.url or (f"llama-server on {server_cfg.model.name}"
                              + (f" (original: {server_cfg.original.name})" if server_cfg.original else "")
                              if server_cfg else "")
        table = write_summaries(out, runs, load, target, argv)
        if args.soak_window:
            table += "\n\n" + write_soak(out, runs, args.soak_warmup, args.soak_window)
        write_plot(out / "serve_load.png", runs)
    except LoadError as e:
        print(f"serve_load: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("serve_load: interrupted" + ("; the server is stopped" if args.model else ""), file=sys.stderr)
        return 130
    print(f"\n{table}\n\nwritten to {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
