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
}


class _Group(click.Group):
    """Turns InferlabError into a one-line message (exit 2); --debug keeps the traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except InferlabError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"inferlab: error: {exc}", err=True)
            sys.exit(2)


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
