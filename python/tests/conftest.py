"""Fixtures for the Python package's tests: the `pipeline` command (to compare against) and small corpora cut
from the repository's fortunes. The tests run the real model through the real ONNX Runtime, as `scripts/setup`
installed them."""

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FORTUNES = ROOT / "examples" / "data" / "fortunes.jsonl"


def pipeline_bin() -> pathlib.Path:
    given = os.environ.get("EMBED_PIPELINE_BIN")
    if given:
        return pathlib.Path(given)
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/embedding-pipeline/target")
    return pathlib.Path(target) / "debug" / "pipeline"


@pytest.fixture(scope="session")
def pipeline():
    """Run the command: pipeline(*args, cwd=...) -> CompletedProcess (text)."""
    binary = pipeline_bin()
    if not binary.exists():
        pytest.fail(f"the pipeline command is not built at {binary}; build it (cargo build) or set EMBED_PIPELINE_BIN")

    def call(*args, cwd):
        return subprocess.run([str(binary), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=600)

    return call


def write_corpus(path: pathlib.Path, rows: int, repeat: str | None = None) -> list[str]:
    """The first `rows` fortunes as JSON lines at `path` (plus one more row with the id `repeat`, if given);
    returns the ids."""
    lines = FORTUNES.read_text().splitlines()[:rows]
    if repeat is not None:
        lines.append(json.dumps({"id": repeat, "text": "the same id again"}))
    path.write_text("\n".join(lines) + "\n")
    return [json.loads(line)["id"] for line in lines]


JOB = """SET embed.model = '{model}';
CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '${{CORPUS}}';
COPY (SELECT id, embed(text) AS embedding FROM docs) TO '${{OUT}}' STORED AS LANCE;
"""


@pytest.fixture
def job(tmp_path):
    """A job file with ${CORPUS} and ${OUT}, embedding with the repository's default model."""
    path = tmp_path / "job.sql"
    path.write_text(JOB.format(model=ROOT / "models" / "all-MiniLM-L6-v2"))
    return path
