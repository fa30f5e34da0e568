"""The real llama-server's --help, when scripts/build_llama_server.sh has built one (optional)."""

import glob
import os
import re
import subprocess
from functools import lru_cache


@lru_cache(maxsize=1)
def llama_server_help() -> str | None:
    root = os.environ.get("INFERLAB_CACHE", os.path.expanduser("~/.cache/inferlab"))
    for marker in glob.glob(os.path.join(root, "llama-server-for-llama-cpp-python-*")):
        path = open(marker).read().strip()
        if os.access(path, os.X_OK):
            break
    else:
        found = glob.glob(os.path.join(root, "llama-server-*", "llama-server"))
        path = found[0] if found else None
    if not path:
        return None
    out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def help_flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))
