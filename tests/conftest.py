import sys
from pathlib import Path

# test helper modules (tests/_paths.py) importable from every test file
sys.path.insert(0, str(Path(__file__).resolve().parent))
