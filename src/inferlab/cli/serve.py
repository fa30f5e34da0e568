"""``inferlab serve``: the lesson's six figures and the calculator as a local web page."""

from __future__ import annotations

import click

from ..errors import InvalidValueError, MissingDependencyError


@click.command()
@click.argument("model_files", nargs=-1, type=click.Path(exists=True))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. The default answers this computer only; another address opens it to your network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one).")
@click.option("--on", "machine", type=click.Choice(["local"]), default=None,
              help="'local': offer this machine (detected, with its calibration profile) and select it by default.")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
def serve(model_files, host, port, machine, open_browser):
    """Serve the figures and the calculator at http://HOST:PORT/.

    MODEL_FILES: GGUF files or Hugging Face folders to add to the model list (read once, at start;
    the page names them by id and never sends a path)."""
    try:
        import uvicorn

        from ..web.app import create_app
    except ImportError as exc:
        raise MissingDependencyError(getattr(exc, "name", None) or "fastapi", "inferlab serve", extra="web") from exc
    if not host:
        raise InvalidValueError("--host must name an address, e.g. 127.0.0.1")
    app = create_app(model_files, local=machine == "local", host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    if open_browser:
        import threading
        import webbrowser

        def _open():
            import time

            while not server.started:
                time.sleep(0.05)
            webbrowser.open(f"http://{shown}:{_bound_port(server) or port}/")

        threading.Thread(target=_open, daemon=True).start()
    click.echo(f"inferlab: serving on http://{shown}:{port}/ (Ctrl-C stops)" if port else "inferlab: serving (port chosen by the system)")
    server.run()


def _bound_port(server) -> int | None:
    for s in getattr(server, "servers", []):
        for sock in getattr(s, "sockets", []):
            return sock.getsockname()[1]
    return None
