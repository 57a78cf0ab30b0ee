"""`kairox run`: generate text from a prompt, streamed, then report speed.

Without a MODEL argument it shows what Kairox does: it runs the default model's Kairox
conversion (made once, on the first such run, and cached next to the default model), then
times decoding with it and with the original GGUF, dense, and prints both speeds on one line.
`--dense` (or `--mode dense`) runs the original default model instead, as llama.cpp would.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import _lib
from .. import format as fmt
from ..default_model import DEFAULT_MODEL, converted_path, ensure_model, model_path
from ..errors import KairoxError
from ..gguf_info import inspect_gguf
from ..hybrid import POLICIES, VRAM_AUTO
from ..llama import MAX_THREADS, ROW_MODES, Model, SamplingParams, Session, default_threads, has_gpu
from ..offline.calibrate import measure, write_calibration
from ..offline.convert import DEFAULT_SPARSITY, ConvertOptions, ConvertResult, convert
from ..offline.corpus import load_corpus
from ._common import activation_option, resolve_model, stderr_console

CTX_ROUND = 256  # automatic context sizes are rounded up to this
COMPARE_STEPS = 32  # decode steps per timed run of the sparse-vs-dense comparison
COMPARE_ROUNDS = 3  # alternating sparse and dense runs; the medians are compared


@dataclass(frozen=True)
class FirstRunConversion:
    """How `kairox run` without a model converts the default model, once.

    Threshold mode at the converter's default sparsity is the mode that pays on this model
    (BENCHMARKS.md: 1.3x dense decode), and it needs neither predictors nor their training, the
    longest stage of a default conversion. The profile is the default corpus alone, without the
    model's own sampled text: sampling it runs at decode speed, the slowest part of a
    conversion on a small or busy machine, and it buys threshold mode little (+2.43% instead of
    +1.75% perplexity on held-out docs, +1.97% instead of +1.43% on prose; offline/convert.py),
    where predictor mode needs it. Grouping and the crossover of the sparse down projection
    are the converter's defaults, the crossover measured on this machine as `kairox convert`
    does. `kairox convert` with defaults makes the full conversion (predictors, self-text)."""

    options: ConvertOptions = ConvertOptions(sparsity=DEFAULT_SPARSITY, mode="threshold",
                                             predictor=False, self_text=0)
    calibrate: bool = True

    def tag(self) -> str:
        """A digest of everything that shapes the file (not the thread count): the cache key."""
        opts = dataclasses.replace(self.options, threads=None)
        key = f"{fmt.FORMAT_VERSION}|{DEFAULT_MODEL.sha256}|{opts!r}|{self.calibrate}"
        return hashlib.sha256(key.encode()).hexdigest()[:12]


FIRST_RUN = FirstRunConversion()


def first_run_model(original: Path, threads: int, console: Console,
                    conversion: FirstRunConversion | None = None) -> Path:
    """The default model's cached Kairox conversion, made now if missing.

    It is written to a temporary sibling (``.NAME.tmp-PID``) and renamed into place only once
    converted and calibrated (convert's before_publish), so an interrupted conversion (an
    error, Ctrl-C, a kill) leaves no file that a later run could take for a finished one.
    Ctrl-C removes the temporary; what a kill leaves, the next run removes."""
    conv = conversion or FIRST_RUN
    dest = converted_path(conv.tag())
    if dest.is_file():
        return dest
    console.print(f"First run: converting {escape(DEFAULT_MODEL.name)} to a Kairox GGUF "
                  f"({conv.options.mode} mode, {conv.options.sparsity:.0%} sparsity); once, "
                  f"cached at {escape(str(dest))}")
    t0 = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_legacy_temporaries(dest.parent)
    crossover: dict[str, float] = {}

    def calibrate(part: Path, res: ConvertResult) -> None:
        if not conv.calibrate:
            return
        t = time.monotonic()
        try:
            write_calibration(part, measure(part, threads, mode="auto", console=console))
        except KairoxError as e:  # the model is complete either way: the built-in crossover applies
            console.print(f"[yellow]note:[/] the sparse down's crossover was not measured ({e})")
        crossover["crossover"] = time.monotonic() - t

    opts = dataclasses.replace(conv.options, threads=threads)
    res = convert(original, dest, load_corpus(None, "profile"), opts, console=console,
                  before_publish=calibrate)
    stages = {k: v for k, v in res.seconds.items() if k != "total"} | crossover
    console.print(f"[green]converted[/] in {time.monotonic() - t0:.0f} s ("
                  + ", ".join(f"{k} {v:.0f} s" for k, v in stages.items()) + ")")
    return dest


def _remove_legacy_temporaries(directory: Path) -> None:
    """Remove the ``.convert-*`` directories that earlier versions converted the default model
    in (named at random, so the next run could not tell them as stale) and that a kill left:
    each holds a whole model. The current version names its temporary with its PID instead."""
    for d in directory.glob(".convert-*"):
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)


class VramBudget(click.ParamType):
    """GiB >= 0, or `auto` (VRAM_AUTO): the device's free memory minus the margin."""

    name = "GIB|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        if str(value).strip().lower() == "auto":
            return VRAM_AUTO
        try:
            v = float(str(value))
        except ValueError:
            self.fail(f"{value!r} is neither a number of GiB nor 'auto'", param, ctx)
        if not (v >= 0 and math.isfinite(v)):
            self.fail(f"{value!r} must be >= 0 GiB (or 'auto')", param, ctx)
        return v


def _ffn_on_host(path: str | os.PathLike[str], dense: bool, vram_budget: float) -> bool:
    """Where a GPU exists, whether to keep the FFN weights in host memory (the rest on the GPU):
    the sparse FFN's row kernels run on the CPU (the hybrid runtime's device half reads its own
    cache), so a Kairox GGUF run sparse needs them there; a dense run keeps upstream's placement."""
    if dense or not has_gpu():
        return False
    return vram_budget != 0 or inspect_gguf(path).has_kairox_data


@click.command("run")
@click.argument("model", required=False)
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "--n-predict", type=click.IntRange(min=1), default=128, show_default=True,
              help="Most tokens to generate.")
@click.option("-t", "--threads", type=click.IntRange(min=1, max=MAX_THREADS), default=default_threads(),
              show_default=True, help="CPU threads.")
@click.option("--seed", type=int, default=None, help="Sampling seed (default: random).")
@click.option("--temp", type=float, default=0.0, show_default=True,
              help="Temperature; 0 or less is greedy decoding.")
@click.option("--top-k", type=int, default=40, show_default=True,
              help="Top-k when sampling (0 = off).")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=0.95,
              show_default=True, help="Top-p when sampling (1 = off).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--ctx", "n_ctx", type=click.IntRange(min=0), default=0, show_default=True,
              help="Context size (llama.cpp rounds it up to a multiple of 256); 0 = just enough for "
                   "the prompt and -n tokens, at most the model's training context.")
@click.option("-b", "--batch-size", type=click.IntRange(min=1), default=512, show_default=True,
              help="Most prompt tokens per decode call.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation.")
@click.option("--dense", is_flag=True, help="Run the dense FFN even on a Kairox GGUF; without MODEL, "
              "the original default model (no conversion, no comparison).")
@click.option("--mode", type=click.Choice(list(_lib.KAIROX_MODES)), default="auto", show_default=True,
              help="Sparse FFN mode (auto: the model's own; dense for a plain GGUF).")
@click.option("--threshold-scale", type=click.FloatRange(0.0, min_open=True), default=1.0,
              show_default=True, help="Multiply the calibrated sparsity thresholds.")
@click.option("--vram-budget", "vram_budget", type=VramBudget(), default="0", show_default=True,
              help="Hybrid runtime: GiB of weights the device holds (dense parts first, then a "
                   "neuron-group cache), or auto: the device's free memory minus the KV cache, "
                   "compute buffers and --vram-reserve; 0 = CPU only. Runs predictor mode.")
@click.option("--vram-reserve", type=click.FloatRange(min=0.0), default=0.5, show_default=True,
              help="Hybrid runtime, --vram-budget auto: GiB of device memory left free besides the "
                   "KV cache and compute buffers.")
@click.option("--policy", type=click.Choice(list(POLICIES)), default="tam", show_default=True,
              help="Hybrid runtime: the cache's balancer policy (tam: adaptive swap margin; tam-t: "
                   "nothing adapts; tam-lambda: the paper's adaptive decay).")
@click.option("--lambda", "lambda_init", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.0,
              help="Hybrid runtime: TAM's decay (0: the balancer's default, 0.9).")
@click.option("--head-start/--no-head-start", default=True, show_default=True,
              help="Hybrid runtime: plan each layer's cache during the layer before it (layer 0 during "
                   "the previous token's last layer), so reloads start early; --no-head-start plans "
                   "every layer at its own step.")
@click.option("--deterministic", is_flag=True,
              help="Reproducible output: the sparse down projection sums in double, so results do not "
                   "depend on the thread count or (hybrid runtime) on where neurons live; the hybrid "
                   "runtime also uses no timing feedback (nothing adapts, same tokens run to run).")
@click.option("--down-dense-share", type=click.FloatRange(min=0.0), default=None,
              help="Share of active neurons above which the sparse down projection reads ffn_down "
                   "in order (0: always, >= 1: never; default: the model's, from kairox calibrate, "
                   "else a built-in crossover per weight type).")
@activation_option("on every path")
@click.option("--mmap/--no-mmap", "use_mmap", default=False, show_default=True,
              help="Map the GGUF file instead of reading it into huge-page-backed memory "
                   "(faster start; sparse rows are read more slowly from a mapping).")
@click.option("--stats", is_flag=True,
              help="Print the active share of FFN neurons per layer (and the hybrid cache's stats).")
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp's log on stderr.")
def run(model: str | None, prompt: str, n_predict: int, threads: int, seed: int | None,
        temp: float, top_k: int, top_p: float, chat: bool, n_ctx: int, batch_size: int,
        ignore_eos: bool, dense: bool, mode: str, threshold_scale: float, vram_budget: float,
        vram_reserve: float, policy: str, lambda_init: float, head_start: bool, deterministic: bool,
        down_dense_share: float | None,
        activation: str, use_mmap: bool, stats: bool, verbose: bool) -> None:
    """Generate text after PROMPT with MODEL (a GGUF file). Without MODEL: the default model,
    SmolLM2-135M-Instruct (downloaded and converted to a Kairox GGUF on first use), with its
    decode speed against the original's, dense. The text streams to stdout; a speed table
    follows on stderr."""
    if not prompt.strip():
        raise click.UsageError("prompt is empty")
    if not math.isfinite(temp):
        raise click.BadParameter("must be a number", param_hint="'--temp'")
    if seed is not None and seed != -1 and not 0 <= seed < _lib.LLAMA_DEFAULT_SEED:
        raise click.BadParameter(f"must be in [0, {_lib.LLAMA_DEFAULT_SEED - 1}] or -1",
                                 param_hint="'--seed'")
    sampling = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p,
                              seed=None if seed in (None, -1) else seed, ignore_eos=ignore_eos)
    console = stderr_console()
    if dense and mode not in ("auto", "dense"):
        raise click.UsageError("--dense and --mode contradict each other")
    reference: Path | None = None  # the original GGUF, decoded dense for comparison
    if model is None and not dense and mode != "dense":
        if vram_budget != 0 or mode == "predictor":
            raise click.UsageError(
                "the default model's Kairox conversion runs threshold mode (no predictors); for "
                "predictor mode or --vram-budget convert it with predictors (kairox convert "
                f"{model_path()} OUT.gguf) and run OUT.gguf")
        reference = ensure_model(console=console)
        path = first_run_model(reference, threads, console)
    else:
        path = resolve_model(model, console)
    if verbose:
        _lib.set_verbose(True)
    rows = not dense and (mode in ROW_MODES or vram_budget != 0)
    with Model(path, use_mmap=use_mmap, ffn_on_host=_ffn_on_host(path, dense, vram_budget),
               ffn_rows=rows) as m:
        text = m.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
        tokens = m.tokenize(text, add_special=True, parse_special=True)
        if n_ctx and len(tokens) >= n_ctx:
            raise click.UsageError(f"the prompt has {len(tokens)} tokens: --ctx {n_ctx} leaves "
                                   f"no room to generate")
        train = m.n_ctx_train
        if train > 0 and len(tokens) > train:
            console.print(f"[yellow]warning:[/] the prompt has {len(tokens)} tokens, more than the "
                          f"{train} this model was trained on: expect degraded output")
        # just enough for the prompt and -n, but never beyond what the model was trained on
        # (as llama.cpp's default context): a huge -n then stops at "context", not at a failed
        # allocation
        want = len(tokens) + n_predict
        if train > 0:
            want = min(want, max(train, len(tokens) + 1))
        ctx_size = n_ctx or -(-want // CTX_ROUND) * CTX_ROUND
        mode = "dense" if dense else mode
        if vram_budget != 0:
            if mode not in ("auto", "predictor"):
                raise click.UsageError("--vram-budget runs the hybrid runtime, which needs predictor mode")
            mode = "predictor"
        _warn_ignored(console, m.has_sparsity, vram_budget != 0)
        stats = stats and m.has_sparsity and mode != "dense"
        with m.session(n_ctx=ctx_size, n_batch=batch_size, n_threads=threads, mode=mode,
                       threshold_scale=threshold_scale, stats=stats, vram_budget_gib=vram_budget,
                       vram_reserve_gib=vram_reserve,
                       policy=policy, lambda_init=lambda_init, head_start=head_start,
                       deterministic=deterministic,
                       down_dense_share=-1.0 if down_dense_share is None else down_dense_share,
                       activation=activation) as session:
            if stats and session.hybrid_info() is not None:
                session.set_hybrid_timing(True)  # the halves' times and overlap in the pipeline table
            _stream(session, tokens, n_predict, sampling)
            console.print(_speed_table(session, len(tokens)))
            if stats:
                console.print(_stats_table(session))
                if session.hybrid_info() is not None:
                    for table in _hybrid_tables(session):
                        console.print(table)
            if reference is not None:
                console.print(_comparison(session, reference, tokens, ctx_size, batch_size, threads,
                                          use_mmap))


def _comparison(session: Session, reference: Path, tokens: list[int], ctx_size: int,
                batch_size: int, threads: int, use_mmap: bool) -> str:
    """One line: the sparse session's decode speed against the original GGUF's, dense, on this
    machine now. Both decode the same prompt and COMPARE_STEPS tokens (greedy, past
    end-of-generation, not shown), alternating COMPARE_ROUNDS times, and the medians are
    compared: a single short answer on a busy machine would time noise, not the models."""
    steps = min(COMPARE_STEPS, session.n_ctx - len(tokens) - 1)
    if steps < 2:
        return "no room left in the context to compare decode speed with dense (raise --ctx)"
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)

    def decode_tps(s: Session) -> float:
        for _ in s.generate(tokens, steps + 1, greedy):  # the last token is not decoded
            pass
        return s.timings().decode_tps

    sparse: list[float] = []
    dense: list[float] = []
    with Model(reference, use_mmap=use_mmap) as m, \
            m.session(n_ctx=ctx_size, n_batch=batch_size, n_threads=threads, mode="dense") as ref:
        for _ in range(COMPARE_ROUNDS):
            dense.append(decode_tps(ref))
            sparse.append(decode_tps(session))
    sp, de = statistics.median(sparse), statistics.median(dense)
    if sp <= 0 or de <= 0:
        return "decode speed could not be compared with dense (nothing decoded)"
    return (f"sparse {sp:.1f} tok/s vs dense {de:.1f} tok/s ({sp / de:.2f}x; dense: the original "
            f"{reference.name}; medians of {COMPARE_ROUNDS} alternating decodes of {steps} tokens)")


def _warn_ignored(console: Console, kairox_model: bool, hybrid: bool) -> None:
    """Options the user typed that this run cannot honour get a warning, not silence."""
    ctx = click.get_current_context()

    def given(*names: str) -> list[str]:
        flags = {p.name: max(p.opts, key=len) for p in ctx.command.params}
        return [flags[n] for n in names
                if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE]

    if not kairox_model:
        ignored = given("threshold_scale", "down_dense_share", "stats", "deterministic", "policy",
                        "lambda_init", "vram_reserve", "head_start")
        if ignored:
            console.print(f"[yellow]warning:[/] not a Kairox GGUF (no sparsity data; see kairox convert): "
                          f"it runs dense, ignoring {', '.join(ignored)}")
    elif not hybrid:
        ignored = given("policy", "lambda_init", "vram_reserve", "head_start")
        if ignored:
            console.print(f"[yellow]warning:[/] {', '.join(ignored)} only apply to the hybrid runtime "
                          "(--vram-budget GIB|auto); ignored")


def _stream(session: Session, tokens: list[int], n_predict: int,
            sampling: SamplingParams) -> None:
    out = sys.stdout
    last = ""
    for piece in session.generate(tokens, n_predict, sampling):
        out.write(piece)
        out.flush()
        last = piece
    if not last.endswith("\n"):
        out.write("\n")
    out.flush()


def _stats_table(session: Session) -> Table:
    """Share of FFN neurons computed per layer (decode steps and sparse batches)."""
    table = Table(title="active FFN neurons per layer", title_justify="left")
    for col in ("layer", "calls", "active", "predicted"):
        table.add_column(col, justify="right")
    for i, st in enumerate(session.layer_stats()):
        table.add_row(str(i), str(st.calls), f"{100 * st.active_fraction:.1f}%",
                      "-" if st.predicted < 0 else f"{100 * st.predicted_fraction:.1f}%")
    return table


def _hybrid_tables(session: Session) -> tuple[Table, Table]:
    """What the device cache did per layer (hits, reloads, lambda), and where the pipeline's
    time went (steps planned before the layer's own input existed, plan, reload copies, waits
    for them, the CPU and device halves, and how long they computed at once)."""
    info, budget = session.hybrid_info(), session.hybrid_budget()
    assert info is not None and budget is not None
    gib = 1 << 30
    auto = ""
    if budget.is_auto:
        auto = (f" (auto: {budget.device_free / gib:.3f} free - KV cache {budget.kv_bytes / gib:.3f} "
                f"- compute {budget.compute_bytes / gib:.3f} - reserve {budget.reserve_bytes / gib:.3f})")
    cache = Table(title=f"hybrid runtime ({info.device}, policy {info.policy}): budget "
                        f"{info.budget_bytes / gib:.3f} GiB{auto}; dense {info.dense_bytes / gib:.3f} "
                        f"+ cache {info.cache_bytes / gib:.3f} GiB, {info.n_slots}/{info.n_groups} "
                        f"groups of {info.group_size}", title_justify="left")
    for col in ("layer", "slots", "hit rate", "loads", "landed early", "MiB reloaded", "lambda", "margin"):
        cache.add_column(col, justify="right")
    # the last graph (one token's): hand-overs between the CPU and the device, and the waits for
    # a GPU they cost (the design: one per layer with a CPU half)
    # short headers, so that the table fits 80 columns; the title says what they mean
    pipe = Table(title=f"hybrid pipeline per layer (ms in all; ahead: steps planned during the layer before; "
                       f"CPU and device: the halves; overlap: share of the shorter half's time the other "
                       f"computed alongside); last token: {session.graph_splits()} backend splits, "
                       f"{session.graph_waits()} waits for the GPU", title_justify="left")
    for col in ("layer", "ahead", "plan", "reload", "stall", "CPU", "device", "overlap", "io-bound"):
        pipe.add_column(col, justify="right")
    for i, st in enumerate(session.hybrid_stats()):
        if st.n_slots == 0:  # no cache in this layer: it runs on the CPU alone, the runtime skips it
            cache.add_row(str(i), f"0/{st.n_groups}", *["-"] * 6)
            pipe.add_row(str(i), *["-"] * 8)
            continue
        cache.add_row(str(i), f"{st.n_slots}/{st.n_groups}",
                      "-" if not st.active else f"{100 * st.hit_rate:.1f}%", str(st.loads),
                      f"{st.loads_early}/{st.loads}", f"{st.bytes_reloaded / (1 << 20):.2f}",
                      f"{st.lambda_now:.3f}", f"{st.margin_now:.3f}")
        pipe.add_row(str(i), f"{st.steps_ahead}/{st.steps}", f"{st.t_plan_us / 1000:.1f}",
                     f"{st.t_io_us / 1000:.1f}", f"{st.t_stall_us / 1000:.1f}", f"{st.t_cpu_us / 1000:.1f}",
                     f"{st.t_dev_us / 1000:.1f}" if st.timed_steps else "-",
                     # the share of the shorter half's time that the other half computed alongside
                     f"{100 * st.overlap_share:.0f}%" if st.t_shorter_us > 0 else "-",
                     f"{st.io_bound_steps}/{st.steps}")
    return cache, pipe


def _speed_table(session: Session, n_prompt: int) -> Table:
    t = session.timings()
    table = Table(title=f"kairox run ({session.mode})", title_justify="left")
    for col in ("prompt tokens", "prompt tok/s", "generated tokens", "decode tok/s", "stop"):
        table.add_column(col, justify="right")
    table.add_row(str(n_prompt), f"{t.prompt_tps:.1f}" if t.prompt_ms > 0 else "-",
                  str(len(session.last_tokens)),
                  f"{t.decode_tps:.1f}" if t.decode_ms > 0 else "-",
                  session.stop_reason or "-")
    return table
