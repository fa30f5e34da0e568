"""tests/robustness: its helper module (_robust_cli) importable from every test here."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
