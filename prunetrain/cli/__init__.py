"""`prunetrain` command line (typer). Every command is a thin layer over a library function.

Every input is checked before any work or any write, and errors in what the user gave (unknown recipe or key, a
value out of range, missing or damaged files, an output directory that already holds something, ...) are one line
on stderr naming the flag or recipe key, with exit code 2 and no traceback (`PRUNETRAIN_DEBUG=1` re-raises the
original exception instead). Where a command may write, and what it may replace, is decided in one place
(`prunetrain.utils.output_paths`): never over, into or around what it reads; `--overwrite` replaces only prunetrain's
own directories, crash-safe at any signal. Model directories are read by `prunetrain.engine.model_dir` only.

One module per command group, each registering its commands on the application of `common` (with the shared
errors, JSON output and input checks): `recipes` (recipe, compare), `translation` (evaluate, translate), `model`
(importance, prune, shrink, curve, bench), `export` and `study`. This module is the entry point
(`prunetrain = prunetrain.cli:main`, `python -m prunetrain.cli`).
"""

from __future__ import annotations

import os
import sys

import typer

# registered in the order `prunetrain --help` lists them
from prunetrain.cli import recipes as _recipes  # noqa: F401,I001  (recipe, compare)
from prunetrain.cli import translation as _translation  # noqa: F401  (evaluate, translate)
from prunetrain.cli import model as _model  # noqa: F401  (importance, prune, shrink, curve, bench)
from prunetrain.cli import export as _export  # noqa: F401  (export)
from prunetrain.cli import study as _study  # noqa: F401  (study ...)
from prunetrain.cli.common import UserError, app


def _one_line(err: BaseException | str) -> str:
    message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    return " ".join(str(message).split()) or type(err).__name__


def main() -> None:
    """Entry point: errors in what the user gave (a flag's value typer cannot read, such as `--num-beams 1.5`, an
    unknown flag, or a value the library refuses) become one line on stderr and exit code 2 (`PRUNETRAIN_DEBUG=1`:
    the original exception and its traceback instead); no arguments at all show the help."""
    # click's exceptions, wherever this typer takes click from (its own copy since typer 0.2x, click before)
    click_errors = sys.modules[typer.BadParameter.__module__]
    no_args = getattr(click_errors, "NoArgsIsHelpError", ())
    debug = os.environ.get("PRUNETRAIN_DEBUG") == "1"
    from prunetrain.utils import progress

    progress.enable()  # bars on stderr when it is a terminal (or PRUNETRAIN_PROGRESS=1)
    try:
        code = app(standalone_mode=False)  # click's errors come here instead of its multi-line usage panel
        sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)  # as standalone mode ends
    except no_args as err:
        err.show()
        sys.exit(err.exit_code)
    except typer.Abort:  # as click's standalone mode reports it
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except click_errors.ClickException as err:
        if debug:
            raise
        typer.echo(f"prunetrain: error: {_one_line(err.format_message())}", err=True)
        sys.exit(err.exit_code)
    except (UserError, ValueError, TypeError, KeyError, OSError, RecursionError) as err:
        if debug:
            raise
        typer.echo(f"prunetrain: error: {_one_line(err)}", err=True)
        sys.exit(2)
    except RuntimeError as err:  # a run that diverged is no mistake in the input: exit code 1, still one line
        from prunetrain.training.finite import TrainingDiverged

        if debug or not isinstance(err, TrainingDiverged):
            raise
        typer.echo(f"prunetrain: error: {_one_line(err)}", err=True)
        sys.exit(1)


__all__ = ["UserError", "app", "main"]

if __name__ == "__main__":  # pragma: no cover
    main()
