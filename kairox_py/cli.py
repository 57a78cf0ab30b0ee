"""The `kairox` command line: a click group plus uniform error handling.

Subcommands live in ``kairox_py/commands/<name>.py``, one module each, and are listed in
:data:`COMMANDS`; adding one (convert, profile, bench, eval, simulate, ...) means adding a
module and a line there. :func:`main` owns the failure contract every subcommand gets
for free: a user error prints exactly one ``error: ...`` line on stderr and exits 1
(2 for command-line usage errors), never a traceback.
"""
from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence

import click

from . import __version__
from .errors import KairoxError

#: (module under kairox_py.commands, attribute holding the click command)
COMMANDS: list[tuple[str, str]] = [
    ("run", "run"),
    ("info", "info"),
    ("profile", "profile"),
    ("convert", "convert"),
    ("import_opt", "import_opt"),
    ("calibrate", "calibrate"),
    ("eval", "eval_cmd"),
    ("passk", "passk"),
    ("trace", "trace"),
    ("simulate", "simulate"),
    ("workload", "workload"),
    ("bench", "bench"),
    ("fetch", "fetch"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="kairox", message="%(prog)s %(version)s")
def cli() -> None:
    """Kairox: activation-sparse LLM inference on llama.cpp."""


for _module, _attr in COMMANDS:
    cli.add_command(getattr(importlib.import_module(f"kairox_py.commands.{_module}"), _attr))


def _error(message: str) -> None:
    one_line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    sys.stderr.write(f"error: {one_line or 'unknown error'}\n")
    sys.stderr.flush()


def _run(argv: Sequence[str] | None) -> int:
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, prog_name="kairox",
                      standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.ClickException as e:  # bad arguments (exit 2) and command errors (exit 1)
        _error(e.format_message())
        return e.exit_code
    except click.Abort as e:  # Ctrl-C (click turns KeyboardInterrupt into Abort), or SIGTERM
        if isinstance(e.__cause__, Terminated):
            _error("terminated")
            return 128 + signal.SIGTERM
        _error("interrupted")
        return 130
    except KairoxError as e:
        _error(str(e))
        return 1
    except BrokenPipeError:  # `kairox run ... | head`: the reader left; not our failure
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as e:  # a bug: still one line, the traceback only on request
        if os.environ.get("KAIROX_VERBOSE", "") not in ("", "0"):
            traceback.print_exc()
        _error(f"internal error: {type(e).__name__}: {e} (set KAIROX_VERBOSE=1 for a traceback)")
        return 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, `kill`, a service manager), raised like Ctrl-C so that the same
    cleanup runs: temporary files of atomic writes are removed, native objects closed."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `kairox` script."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.exit(_run(argv))


if __name__ == "__main__":
    main()
