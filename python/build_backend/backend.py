"""maturin, building into the project's target directory (``$CARGO_TARGET_DIR``, else
``~/.cache/embedding-pipeline/target``, where scripts/quickstart and scripts/test build ``pipeline``), so that
``pip install ./python`` compiles this package's bridge and not the pipeline's dependencies again."""

import os
import sys
import sysconfig

# maturin's hooks call the `maturin` program: find the one installed beside this Python even when its
# environment's scripts are not on PATH (`venv/bin/python -m pip install ./python`).
os.environ["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
os.environ.setdefault(
    "CARGO_TARGET_DIR", os.path.join(os.path.expanduser("~"), ".cache", "embedding-pipeline", "target")
)

from maturin import *  # noqa: E402,F401,F403  (the PEP 517 hooks)
from maturin import build_sdist  # noqa: E402,F401
from maturin import build_wheel as _maturin_build_wheel  # noqa: E402


def build_lock_held(target_dir):
    """Whether another cargo build holds the dev profile's lock in ``target_dir`` (cargo's ``.cargo-lock``), which
    this build will wait on without a word: pip shows a build backend's output only when it fails."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: nothing to tell
        return False
    path = os.path.join(target_dir, "debug", ".cargo-lock")
    try:
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def say_if_waiting(target_dir, stream=None):
    """Tell the person at the terminal (pip hides this backend's own output) that the build waits on another."""
    if not build_lock_held(target_dir):
        return False
    message = (
        f"embedding-pipeline: another build holds {target_dir} (a `cargo` or `pipeline` build); this install "
        "waits for it to finish, then builds the package's extension\n"
    )
    try:
        out = stream or open("/dev/tty", "w")
    except OSError:
        out = sys.stderr
    out.write(message)
    out.flush()
    return True


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    say_if_waiting(os.environ["CARGO_TARGET_DIR"])
    return _maturin_build_wheel(wheel_directory, config_settings, metadata_directory)

try:
    from maturin import build_editable, get_requires_for_build_wheel, prepare_metadata_for_build_wheel  # noqa: F401
except ImportError:  # older maturin: pip falls back to its own defaults
    pass
