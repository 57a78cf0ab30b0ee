"""`kairox convert IN.gguf OUT.gguf`: write a Kairox GGUF (thresholds, predictors,
co-activation grouping); see kairox_py.offline.convert and docs/FORMAT.md.

OUT appears only when everything is done: the report and the crossover calibration run on
the finished temporary file before it is renamed into place, so a conversion stopped at any
stage (Ctrl-C, SIGTERM, SIGKILL, a full disk) leaves no OUT at all, never one that lacks its
crossover. The report's files are each replaced by a rename (outputs.atomic_files_into)."""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import click
from rich.table import Table

from ..errors import KairoxError
from ..format import MODES
from ..llama import default_threads
from ..offline.calibrate import measure, write_calibration
from ..offline.convert import (
    DEFAULT_DOWN_TYPE,
    DEFAULT_MAX_PRED_DENSITY,
    DEFAULT_MODE,
    DEFAULT_PRED_DOWN_SCALE,
    DEFAULT_RECALL,
    DEFAULT_SELF_TEXT,
    DEFAULT_SPARSITY,
    PRED_TYPES,
    SELF_TEXT_MAX_PARAMS,
    ConvertOptions,
    ConvertResult,
    summary_rows,
)
from ..offline.convert import (
    convert as run_convert,
)
from ..offline.corpus import load_corpus, read_corpus
from ..offline.fit import DEFAULT_FIT_TOKENS, DEFAULT_MAX_PPL_INCREASE
from ..offline.grouping import DEFAULT_GROUP_SIZE
from ..offline.predictor import TrainConfig
from ..offline.profile import DEFAULT_TOKENS
from ..offline.quant import WRITABLE_TYPES
from ..offline.report import write_layer_report
from ..outputs import atomic_files_into, disk_full_error, is_disk_full, pause_point
from ._common import activation_option, stderr_console


def _given(param: str) -> bool:
    """Whether the user typed this option (not its default): an explicit --corpus/--tokens must
    match a reused --profile directory."""
    src = click.get_current_context().get_parameter_source(param)
    return src is click.core.ParameterSource.COMMANDLINE


@click.command("convert")
@click.argument("input_path", metavar="IN.gguf", type=click.Path(dir_okay=False))
@click.argument("output_path", metavar="OUT.gguf", type=click.Path(dir_okay=False))
@click.option("--profile", "profile_dir", type=click.Path(file_okay=False), default=None,
              help="Profile directory to reuse (or to create). Default: the cache.")
@click.option("--corpus", multiple=True, type=click.Path(dir_okay=False),
              help="Text file(s) to profile on (default: pydoc topics, profiling split).")
@click.option("--tokens", type=click.IntRange(min=1), default=DEFAULT_TOKENS, show_default=True,
              help="Tokens to profile.")
@click.option("--sparsity", type=click.FloatRange(0.0, 1.0, max_open=True),
              default=DEFAULT_SPARSITY, show_default=True,
              help="Target share of FFN neurons skipped (threshold calibration); where given, "
                   "the thresholds are kept at it (no --fit unless asked for).")
@click.option("--fit/--no-fit", default=None,
              help="Fit the thresholds to --max-ppl-increase on held-out text once the model is "
                   "written: the largest threshold scale within the budget (default: on, off "
                   "where --sparsity is given).")
@click.option("--max-ppl-increase", type=click.FloatRange(0.0, 10.0, min_open=True, max_open=True),
              default=DEFAULT_MAX_PPL_INCREASE, show_default=True,
              help="--fit's budget: perplexity at most this share above dense.")
@click.option("--fit-corpus", multiple=True, type=click.Path(dir_okay=False),
              help="Text file(s) --fit scores, as one text (default: three, each held to the budget: pydoc "
                   "topics held-out, project-written prose, CPython source).")
@click.option("--fit-tokens", type=click.IntRange(min=64), default=DEFAULT_FIT_TOKENS, show_default=True,
              help="Tokens of each text --fit scores per threshold scale.")
@click.option("--recall", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=DEFAULT_RECALL, show_default=True, help="Predictor recall target.")
@click.option("--group-size", type=int, default=DEFAULT_GROUP_SIZE, show_default=True,
              help="Neurons per co-activation group (must divide the FFN width).")
@click.option("--down-type", type=click.Choice(("auto", *WRITABLE_TYPES), case_sensitive=False),
              default=DEFAULT_DOWN_TYPE, show_default=True,
              help="ggml type of ffn_down_t (auto: q6_k where every original ffn_down has at most "
                   "6 bits per weight and n_embd is a multiple of 256, else q8_0).")
@click.option("--down-t-in-file", is_flag=True,
              help="Write ffn_down_t (a transposed copy of every ffn_down) into the file; by "
                   "default the loader derives it at load, and the file stays near the "
                   "original's size.")
@click.option("--mode", type=click.Choice(MODES), default=DEFAULT_MODE, show_default=True,
              help="The model's default sparse mode (kairox.mode).")
@activation_option("profiled with and written as kairox.activation")
@click.option("--no-predictor", is_flag=True, help="Do not train predictors.")
@click.option("--max-pred-density", type=click.FloatRange(0.0, 1.0, min_open=True),
              default=DEFAULT_MAX_PRED_DENSITY, show_default=True,
              help="Write no predictors where they select more than this share of the neurons at "
                   "--recall (decided on a few sampled layers first, then on all; 1: keep them).")
@click.option("--reorder/--no-reorder", default=None,
              help="Reorder FFN neurons into hot-first co-activation groups, or keep the original "
                   "order (default: reorder where predictors are written; predictor mode and the "
                   "GPU group cache read groups, while without them the original order keeps "
                   "dense prefill free of an un-permute).")
@click.option("--epochs", type=click.IntRange(min=1), default=TrainConfig.epochs,
              show_default=True, help="Predictor training epochs.")
@click.option("--pred-type", type=click.Choice(PRED_TYPES), default="auto", show_default=True,
              help="Type of the predictor weights (auto: q8_0 where the rows are multiples of 32, "
                   "else f16; q8_0/q4_0: rows must be multiples of 32).")
@click.option("--pred-down-scale", type=click.FloatRange(0.0), default=DEFAULT_PRED_DOWN_SCALE,
              show_default=True,
              help="Predictor mode computes a predicted neuron's down row only where "
                   "|act(gate)*up| > this x the calibrated threshold (0: every predicted row).")
@click.option("--self-text", "self_text", type=click.IntRange(min=0), default=None,
              help="Also profile this many tokens of the model's own sampled answers to a varied "
                   "prompt set, half and half with the corpus (cached; 0: off) [default: "
                   f"{DEFAULT_SELF_TEXT} with the default corpus for models up to "
                   f"{SELF_TEXT_MAX_PARAMS // 10**9}B parameters, else 0].")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for the per-layer report (default: OUT.gguf.report).")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for profiling (and for calibrating: use the count you will run with).")
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="Measure the sparse down's crossover on this machine at the end (kairox "
                   "calibrate; seconds on small models, a few minutes on 7B).")
def convert(input_path: str, output_path: str, profile_dir: str | None, corpus: tuple[str, ...],
            tokens: int, sparsity: float, fit: bool | None, max_ppl_increase: float,
            fit_corpus: tuple[str, ...], fit_tokens: int, recall: float, group_size: int, down_type: str,
            down_t_in_file: bool, mode: str, activation: str, no_predictor: bool, max_pred_density: float, reorder: bool | None,
            epochs: int, pred_type: str,
            pred_down_scale: float, self_text: int | None, report_dir: str | None, threads: int | None,
            calibrate: bool) -> None:
    """Convert IN.gguf into a Kairox GGUF at OUT.gguf (written atomically)."""
    console = stderr_console()
    if self_text is None and corpus:
        self_text = 0
    opts = ConvertOptions(sparsity=sparsity, recall=recall, group_size=group_size,
                          down_type=down_type.lower(), down_t_in_file=down_t_in_file, mode=mode,
                          predictor=not no_predictor,
                          pred_type=pred_type, pred_down_scale=pred_down_scale, reorder=reorder,
                          tokens=tokens, threads=threads, train=TrainConfig(recall=recall, epochs=epochs),
                          self_text=self_text, activation=activation, max_pred_density=max_pred_density,
                          profile_match_corpus=_given("corpus"), profile_match_tokens=_given("tokens"),
                          fit_ppl=max_ppl_increase if (fit if fit is not None else not _given("sparsity")) else None,
                          fit_tokens=fit_tokens, fit_corpus=read_corpus(fit_corpus) if fit_corpus else None)
    text = load_corpus(list(corpus), "profile")
    out = Path(output_path)
    rdir = Path(report_dir) if report_dir else out.with_name(out.name + ".report")
    files: list[Path] = []
    crossover: list[tuple[str, str]] = []

    def finish(tmp: Path, res: ConvertResult, reports: ExitStack) -> None:
        """The report (into a temporary directory whose files `reports` moves into place
        when it closes), then the crossover measured on the complete temporary model."""
        rdir.parent.mkdir(parents=True, exist_ok=True)
        rtmp = reports.enter_context(atomic_files_into(rdir))
        written = write_layer_report(rtmp, res.predictors, res.groupings,
                                     f"{out.name}: sparsity {sparsity}, recall {recall}")
        files.extend(rdir / f.name for f in written)
        pause_point("report")  # test hook (outputs.pause_point): report written, nothing renamed
        if not calibrate:
            crossover.append(("next", f"kairox calibrate {out} on each machine that runs it (the "
                                      "sparse down's crossover)"))
            return
        pause_point("crossover")  # test hook: the model is complete under its temporary name
        try:
            cal = measure(tmp, threads or default_threads(), mode="auto", console=console)
            write_calibration(tmp, cal)
            crossover.append(("down crossover", f"{cal.share:.3f} (kairox.down_dense_share, measured here "
                                                f"with {cal.threads} threads; on another machine: "
                                                f"kairox calibrate {out})"))
            if cal.gate_up_rows >= 0:
                crossover.append(("gate/up", f"{'row kernels' if cal.gate_up_rows else 'ggml mat-vec'} "
                                             f"(kairox.gate_up_rows = {cal.gate_up_rows}: decode graph "
                                             f"{cal.rows_us:.0f} vs {cal.ggml_us:.0f} us/token, measured here)"))
        except KairoxError as e:  # the model is complete either way: the built-in crossover applies
            crossover.append(("down crossover", f"not measured ({e}); built-in per type"))

    try:
        # the report's files move into place after OUT's rename (when `reports` closes): a
        # report never describes an OUT that a kill kept from existing
        with ExitStack() as reports:
            res = run_convert(input_path, output_path, text, opts, profile_dir=profile_dir,
                              console=console, before_publish=lambda tmp, r: finish(tmp, r, reports))
    except OSError as e:  # a full disk outside the GGUF's own write (the report): still one line
        if is_disk_full(e):
            raise disk_full_error(e.filename or rdir) from None
        raise
    table = Table(title="kairox convert", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in summary_rows(res):
        table.add_row(k, v)
    table.add_row("report", ", ".join(str(f) for f in files))
    for k, v in crossover:
        table.add_row(k, v)
    console.print(table)
