"""The `inferlab` command. Each command group lives in its own module under inferlab.cli and is
registered in COMMAND_MODULES; errors become one line on stderr and exit code 2."""

from __future__ import annotations

import importlib
import sys

import click

from ..errors import InferlabError

# module name under inferlab.cli -> the click command objects it exports (attribute names)
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "fit": ("fit", "models", "machines"),
    "machine": ("machine", "calibrate", "validate"),
    "gguf_plan": ("gguf_plan",),
    "run": ("run", "profile"),
    "simulate": ("simulate",),
    "serve": ("serve",),
    "trace": ("trace",),
    "roofline": ("roofline",),
    "capacity": ("capacity",),
    "advise": ("advise",),
    "diagnose": ("diagnose",),
}


EXIT_BAD_INPUT = 2  # one line on stderr naming the value
EXIT_INTERNAL = 70  # an unexpected error: one line, --debug for the traceback (EX_SOFTWARE)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


def _one_line(text: object) -> str:
    from .common import strip_control  # a name or a path from a file may hold escape sequences

    return " ".join(strip_control(text).split())


class _Group(click.Group):
    """Errors become one line on stderr: inferlab's typed errors and the operating system's file
    errors exit 2, Ctrl-C 130, anything else 70 ("internal error"); --debug keeps the traceback."""

    def invoke(self, ctx: click.Context):
        debug = bool(ctx.obj and ctx.obj.get("debug")) or "--debug" in sys.argv[1:2]
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a bad option or argument: one line too, with where to look
            if debug:
                raise
            cmd = exc.ctx.command_path if exc.ctx is not None else "inferlab"
            click.echo(f"inferlab: error: {_one_line(exc.format_message())} (see `{cmd} --help`)", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            if debug:
                raise
            click.echo("inferlab: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except InferlabError as exc:
            if debug:
                raise
            click.echo(f"inferlab: error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except OSError as exc:  # a file that cannot be read or written: name it
            if debug:
                raise
            where = f" {exc.filename!r}" if getattr(exc, "filename", None) else ""
            click.echo(f"inferlab: error:{where} {_one_line(exc.strerror or exc)}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except (RecursionError, MemoryError) as exc:
            if debug:
                raise
            click.echo(f"inferlab: error: the input is too deeply nested or too large ({type(exc).__name__})", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except Exception as exc:  # the last resort: a bug, said in one line  # noqa: BLE001
            if debug:
                raise
            click.echo(f"inferlab: internal error: {type(exc).__name__}: {_one_line(exc)} "
                       "(run `inferlab --debug ...` for the traceback, and please report it)", err=True)
            sys.exit(EXIT_INTERNAL)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(package_name="inferlab")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Does it fit, where do the bytes live, how fast will it run."""
    ctx.obj = {"debug": debug}


for _mod, _names in COMMAND_MODULES.items():
    _m = importlib.import_module(f"inferlab.cli.{_mod}")
    for _n in _names:
        cli.add_command(getattr(_m, _n))


def main() -> None:
    cli(prog_name="inferlab")


if __name__ == "__main__":
    main()
