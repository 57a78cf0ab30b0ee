"""Per-machine crossover of the sparse down projection (`kairox calibrate`).

When most neurons are active, reading ffn_down in order (ggml's dense kernels, on the CPU
backend's repacked rows where it repacks them) beats the axpy over down_t's active rows. Where
the two meet depends on the CPU, not on the model: on one of this project's VMs (AMD) the dense
kernels ran near memory bandwidth and the axpy tiles at 0.57-0.75x of them; on another (Intel)
the dense kernels reached ~10 GB/s and the tiles, which stream their rows into L2, 1.3-1.6x
that. A built-in table cannot be right for both, so this measures both paths on the machine
and the model that will run, with the same tokens and masks, and stores the share in the GGUF
(kairox.down_dense_share), where every tool built from this tree reads it.

The dense path costs D per token whatever the share; the axpy's cost is measured at the
model's own active share rho and with every neuron active (the thresholds scaled to ~0), and
taken as linear in between (a fixed part per op, which dominates small models, plus a part per
row), so the paths cross where that line meets D.

Threshold mode computes every row of gate and up (its mask needs every neuron's value). Where
they are in plain rows, the sparse op's row kernels or ggml's mat-vec can compute them, and
which is faster depends on the type and the CPU as well: on one of the VMs the row kernels ran
Q4_1 far faster than ggml and Q5_0 slower. The calibration times whole decode steps both ways
in the same rounds and stores the faster (kairox.gate_up_rows).
"""
from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType
from rich.console import Console

from .. import format as fmt
from ..errors import KairoxError
from ..llama import ContextParams, Model
from ..progress import make_progress
from .convert import rewrite_metadata

#: a prompt of our own; the model continues it greedily and those tokens are replayed
DEFAULT_PROMPT = ("A short guide to keeping a vegetable garden: choose a sunny spot, loosen the "
                  "soil, and water the young plants early in the morning so that")
MAX_CTX = 4096  # most tokens a replay (prompt and timed steps) may take
CTX_STEP = 256  # the context is rounded up to this (llama.cpp pads its KV cache so)
PROMPT_BATCH = 64  # tokens per prompt call: the compute buffers are sized for it
ALWAYS_DENSE = 0.0  # down_dense_share: read ffn_down whenever a neuron is active
NEVER_DENSE = 2.0   # down_dense_share: always the axpy over the active rows
# Timings count once the two fastest rounds of every path agree within SETTLE: a busy machine
# (another process on the cores) makes single rounds several times slower and at random, and
# two paths 20% apart then swap places. Up to SETTLE_ROUNDS x the asked rounds are run.
SETTLE = 1.05
SETTLE_ROUNDS = 3


@dataclass(frozen=True)
class Calibration:
    threads: int
    mode: str
    tokens: int          # decode steps timed per round
    rounds: int          # rounds run (more than asked when they disagreed)
    active_share: float  # mean share of active down rows (the model's own masks)
    full_share: float    # the same with the thresholds scaled to ~0 (~1)
    dense_us: float      # ffn_down per token, all layers, reading ffn_down in order (fastest round)
    sparse_us: float     # the same, axpy over the active rows of down_t, the model's masks
    full_us: float       # the axpy with every neuron active
    share: float         # the crossover, in [0, 1] (1: the axpy always wins)
    # threshold mode: graph time per token with gate/up through the row kernels and through
    # ggml's mat-vec (None: not measured, another mode), and the faster (1 rows, 0 ggml, -1 none)
    rows_us: float | None = None
    ggml_us: float | None = None
    gate_up_rows: int = -1

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("mode, threads", f"{self.mode}, {self.threads}"),
            ("decode steps timed", f"{self.tokens} x {self.rounds} rounds per path"),
            ("ffn_down read in order", f"{self.dense_us:.1f} us/token"),
            (f"axpy, {100 * self.active_share:.1f}% of rows active", f"{self.sparse_us:.1f} us/token"),
            (f"axpy, {100 * self.full_share:.1f}% of rows active", f"{self.full_us:.1f} us/token"),
            ("crossover (kairox.down_dense_share)", f"{self.share:.3f}"),
            *self.gate_up_table(),
        ]

    def gate_up_table(self) -> list[tuple[str, str]]:
        if self.rows_us is None or self.ggml_us is None:
            return []
        pick = "row kernels" if self.gate_up_rows == 1 else "ggml's mat-vec"
        return [
            ("decode graph, gate/up by the row kernels", f"{self.rows_us:.1f} us/token"),
            ("decode graph, gate/up by ggml's mat-vec", f"{self.ggml_us:.1f} us/token"),
            ("gate/up (kairox.gate_up_rows)", f"{self.gate_up_rows}: {pick}"),
        ]


def crossover(rho: float, sparse_us: float, rho_full: float, full_us: float, dense_us: float) -> float:
    """The share where the axpy's line through (rho, sparse_us) and (rho_full, full_us) meets
    dense_us, in [0, 1]."""
    if full_us <= dense_us:
        return 1.0
    if rho_full - rho < 0.05 or full_us <= sparse_us:  # no slope to speak of: through the origin
        return min(1.0, max(0.0, rho * dense_us / sparse_us))
    slope = (full_us - sparse_us) / (rho_full - rho)
    return min(1.0, max(0.0, rho + (dense_us - sparse_us) / slope))


def _decode_us(model: Model, params: ContextParams, prompt: Sequence[int],
               tokens: Sequence[int]) -> tuple[float, float, float, set[str]]:
    """Per decode step: ffn_down's time (AXPY_SPARSE nodes, all layers), the whole graph's
    time (every node), the down's active share; and the ops that ran."""
    with model.session(params) as s:
        s.decode(prompt)
        s.reset_stats()
        s.set_op_timing(True)
        for t in tokens:
            s.decode([t])
        s.set_op_timing(False)
        times = s.op_times()
        us = sum(total for _name, op, _count, total in times if op == "AXPY_SPARSE")
        graph = sum(total for _name, _op, _count, total in times)
        stats = [st for st in s.layer_stats() if st.pairs > 0]
    if us <= 0 or not stats:
        raise KairoxError("no sparse down projection ran: is the model converted, and its mode sparse?")
    return (us / len(tokens), graph / len(tokens), float(np.mean([st.active_fraction for st in stats])),
            {op for _name, op, _count, _total in times})


def _settled(timings: Sequence[list[float]]) -> bool:
    """True when each path's two fastest rounds agree within SETTLE."""
    for t in timings:
        a, b = sorted(t)[:2]
        if not (b <= a * SETTLE):
            return False
    return True


def measure(path: Path, threads: int, n_tokens: int = 32, rounds: int = 3, mode: str = "auto",
            prompt: str = DEFAULT_PROMPT, console: Console | None = None) -> Calibration:
    """Time both paths of the sparse down projection (and threshold mode's gate/up both ways),
    interleaved round by round (a shared machine drifts), on the same greedy continuation of
    `prompt`; each path's fastest round counts. KairoxError when, with rounds > 1, the
    rounds never agree (SETTLE): a decision from such timings would be a coin toss."""
    if n_tokens < 1 or rounds < 1:
        raise KairoxError("tokens and rounds must be >= 1")
    # weights read, not mapped: the mapped pages of the tensors the loader repacks would stay
    # resident next to their copies (a conversion's peak memory, as in fit.py)
    with Model(path, use_mmap=False) as m:
        if not m.has_sparsity:
            raise KairoxError(f"{path} carries no Kairox sparsity data: convert it first (kairox convert)")
        ids = m.tokenize(prompt, add_special=True)
        if len(ids) + n_tokens + 1 > MAX_CTX:
            raise KairoxError(f"prompt ({len(ids)} tokens) plus {n_tokens} steps exceed {MAX_CTX} tokens")
        # a context and batch no larger than the replay needs: the KV cache grows with the one,
        # the compute buffers with the other, and on a large model both add to the conversion's
        # peak memory (the calibration runs with the whole model resident)
        n_ctx = -(-(len(ids) + n_tokens + 1) // CTX_STEP) * CTX_STEP
        base = ContextParams(n_ctx=n_ctx, n_batch=min(n_ctx, PROMPT_BATCH), n_threads=threads, mode=mode,
                             stats=True)
        with m.session(base) as s:  # the continuation every timed run replays
            run_mode = s.mode
            if run_mode == "dense":
                raise KairoxError("calibration needs a sparse mode (the model or --mode chose dense)")
            s.decode(ids)
            cont = [int(np.argmax(s.logits()))]
            for _ in range(n_tokens - 1):
                s.decode([cont[-1]])
                cont.append(int(np.argmax(s.logits())))
        runs = {  # what each timed config changes
            "dense": replace(base, down_dense_share=ALWAYS_DENSE),
            "sparse": replace(base, down_dense_share=NEVER_DENSE),
            "full": replace(base, down_dense_share=NEVER_DENSE, threshold_scale=1e-9, pred_threshold=1e-6),
        }
        if run_mode == "threshold":  # its gate/up, whole: the row kernels against ggml's mat-vec
            runs["rows"] = replace(base, gate_up_rows=1)
            runs["ggml"] = replace(base, gate_up_rows=0)
        us: dict[str, list[float]] = {k: [] for k in runs}
        graph: dict[str, list[float]] = {k: [] for k in runs}
        act: dict[str, list[float]] = {k: [] for k in runs}

        def decisive() -> list[list[float]]:
            """The timings the decisions read: wall time of the down paths, graph time of the
            gate/up paths."""
            return [us[k] for k in ("dense", "sparse", "full")] + [graph[k] for k in ("rows", "ggml") if k in runs]

        done, settled = 0, False
        limit = rounds if rounds == 1 else SETTLE_ROUNDS * rounds  # one round: nothing to compare
        with make_progress(console, transient=True) as bar:
            task = bar.add_task("timing ffn_down" + (" and gate/up" if "rows" in runs else ""),
                                total=len(runs) * rounds)
            while not settled and done < limit:
                for k, p in list(runs.items()):
                    if k not in runs:
                        continue
                    t, g, a, ops = _decode_us(m, p, ids, cont)
                    us[k].append(t)
                    graph[k].append(g)
                    act[k].append(a)
                    bar.advance(task)
                    if k == "rows" and "MUL_MAT_SPARSE" not in ops:
                        # gate/up in the CPU backend's repacked layout: ggml's kernels read them
                        # either way, so there is nothing to choose
                        del runs["rows"], runs["ggml"]
                        bar.update(task, total=len(runs) * rounds, completed=len(runs) * (done + 1))
                done += 1
                settled = done >= rounds and (rounds == 1 or _settled(decisive()))
                if done == rounds and not settled:
                    bar.update(task, total=len(runs) * limit,
                               description="timing again (rounds disagree: is the machine busy?)")
    if not settled:
        raise KairoxError(f"the timings did not settle in {done} rounds (the two fastest rounds of a path "
                          f"differ by more than {100 * (SETTLE - 1):.0f}%): the machine looks busy; run "
                          "kairox calibrate MODEL when it is idle")
    # other work on the machine only adds time, so each path's fastest round is its own cost
    fast = {k: min(us[k]) for k in ("dense", "sparse", "full")}
    rho = float(np.mean(act["sparse"] + act["dense"]))
    rho_full = float(np.mean(act["full"]))
    share = crossover(rho, fast["sparse"], rho_full, fast["full"], fast["dense"])
    rows_us = ggml_us = None
    gate_up_rows = -1
    if "rows" in runs and graph["ggml"]:
        rows_us, ggml_us = min(graph["rows"]), min(graph["ggml"])
        gate_up_rows = 0 if ggml_us < rows_us else 1
    return Calibration(threads, run_mode, n_tokens, done, rho, rho_full, fast["dense"], fast["sparse"],
                       fast["full"], share, rows_us, ggml_us, gate_up_rows)


# sizes of GGUF's fixed-size value types (GGUFValueType: uint8 ... float64)
_KV_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_KV_STRING, _KV_ARRAY = 8, 9


def find_kv(path: Path, key: str) -> tuple[int, int, str] | None:
    """(value type, file offset of the value, byte order) of a metadata key of a GGUF (version
    2 or later), or None where the file does not hold it. It walks the key-value section with
    struct alone: GGUFReader parses every value into numpy views, which for a 150k-token
    vocabulary takes tens of seconds and half a GB. ValueError where the file cannot be walked."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise ValueError("not a GGUF file")
        bo = "<" if struct.unpack_from("<I", mm, 4)[0] & 0xFFFF else ">"
        if struct.unpack_from(bo + "I", mm, 4)[0] < 2:
            raise ValueError("GGUF version 1")
        n_kv = struct.unpack_from(bo + "Q", mm, 16)[0]
        pos = 24

        def string_end(at: int) -> int:
            return at + 8 + struct.unpack_from(bo + "Q", mm, at)[0]

        for _ in range(n_kv):
            end = string_end(pos)
            name = mm[pos + 8:end].decode("utf-8", errors="replace")
            vtype = struct.unpack_from(bo + "I", mm, end)[0]
            pos = end + 4
            if name == key:
                return vtype, pos, bo
            if vtype in _KV_SIZES:
                pos += _KV_SIZES[vtype]
            elif vtype == _KV_STRING:
                pos = string_end(pos)
            elif vtype == _KV_ARRAY:
                etype, count = struct.unpack_from(bo + "IQ", mm, pos)
                pos += 12
                if etype in _KV_SIZES:
                    pos += _KV_SIZES[etype] * count
                elif etype == _KV_STRING:
                    for _ in range(count):
                        pos = string_end(pos)
                else:
                    raise ValueError(f"an array of type {etype} in {name}")
            else:
                raise ValueError(f"value type {vtype} of {name}")
            if pos > len(mm):
                raise ValueError("the metadata runs past the end of the file")
    return None


_PACK = {GGUFValueType.FLOAT32: "f", GGUFValueType.INT32: "i"}


def _write_in_place(path: Path, key: str, vtype: GGUFValueType, value: float | int) -> bool:
    """Overwrite a 4-byte value where the file holds `key` with that type (find_kv); False
    where it does not, or where the file cannot be walked that way (GGUFReader decides)."""
    try:
        found = find_kv(path, key)
    except (ValueError, OSError, struct.error):
        return False
    if found is None or found[0] != vtype:
        return False
    _, offset, bo = found
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(bo + _PACK[vtype], value))
    return True


def _write_values(path: Path, values: Sequence[tuple[str, GGUFValueType, float | int]],
                  console: Console | None) -> None:
    """Store 4-byte metadata values: in place where the file holds each key with its type
    already (as llama.cpp's gguf_set_metadata does; `kairox convert` writes placeholders),
    else (a GGUF converted before a key existed) by rewriting the file atomically."""
    missing = [(k, t, v) for k, t, v in values if not _write_in_place(path, k, t, v)]
    if not missing:
        return
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # noqa: BLE001 - the gguf reader raises ValueError, IndexError, ...
        raise KairoxError(f"cannot read {path} as GGUF: {e}") from None
    if fmt.KEY_FORMAT_VERSION not in reader.fields:
        raise KairoxError(f"{path} is not a Kairox GGUF (kairox convert makes one)")
    present = set()
    for key, vtype, _ in missing:
        field = reader.get_field(key)
        if field is not None:
            if field.types != [vtype]:
                raise KairoxError(f"{path}: {key} is not {'an f32' if vtype == GGUFValueType.FLOAT32 else 'an i32'}")
            present.add(key)  # a file find_kv cannot walk: the rewrite replaces the value
    rewrite_metadata(reader, path, [(k, v, t, None) for k, t, v in missing], frozenset(present), console)


def _share_value(share: float) -> tuple[str, GGUFValueType, float]:
    """kairox.down_dense_share as a value to write; KairoxError unless finite and >= 0."""
    if not (0.0 <= share and np.isfinite(share)):
        raise KairoxError(f"down_dense_share must be finite and >= 0, got {share}")
    return fmt.KEY_DOWN_DENSE_SHARE, GGUFValueType.FLOAT32, float(share)


def write_share(path: Path, share: float, console: Console | None = None) -> None:
    """Store kairox.down_dense_share in the GGUF (in place, or by an atomic rewrite of a file
    converted before the key existed)."""
    _write_values(path, [_share_value(share)], console)


def write_calibration(path: Path, cal: Calibration, console: Console | None = None) -> None:
    """Store what `cal` measured: the down crossover, and threshold mode's gate/up choice
    where it was measured."""
    values: list[tuple[str, GGUFValueType, float | int]] = [_share_value(cal.share)]
    if cal.gate_up_rows >= 0:
        values.append((fmt.KEY_GATE_UP_ROWS, GGUFValueType.INT32, int(cal.gate_up_rows)))
    _write_values(path, values, console)