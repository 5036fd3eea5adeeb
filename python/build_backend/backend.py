"""maturin, building into the project's target directory (``$CARGO_TARGET_DIR``, else
``~/.cache/embedding-pipeline/target``, where scripts/quickstart and scripts/test build ``pipeline``), so that
``pip install ./python`` compiles this package's bridge and not the pipeline's dependencies again."""

import os
import sysconfig

# maturin's hooks call the `maturin` program: find the one installed beside this Python even when its
# environment's scripts are not on PATH (`venv/bin/python -m pip install ./python`).
os.environ["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
os.environ.setdefault(
    "CARGO_TARGET_DIR", os.path.join(os.path.expanduser("~"), ".cache", "embedding-pipeline", "target")
)

from maturin import *  # noqa: E402,F401,F403  (the PEP 517 hooks)
from maturin import build_sdist, build_wheel  # noqa: E402,F401

try:
    from maturin import build_editable, get_requires_for_build_wheel, prepare_metadata_for_build_wheel  # noqa: F401
except ImportError:  # older maturin: pip falls back to its own defaults
    pass
