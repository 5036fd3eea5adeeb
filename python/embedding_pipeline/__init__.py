"""Embedding campaigns with SQL, from Python.

The same library the ``pipeline`` command runs on, called in process:

- ``run(job)``: a job's SQL statements, as ``pipeline run`` runs them (resumed, fingerprinted, checked), with a
  progress bar; returns the run's report.
- ``sql(query)``: statements in a kept session, as ``pipeline sql`` runs them; the last query's result comes
  back as a ``pyarrow.Table`` whose buffers are the pipeline's own (no copy).
- ``embed(texts)``: vectors as a NumPy array, made as a campaign with that model directory makes them.
- ``plan(job)``, ``trial(job)``, ``verify(dataset)``: the reports of ``pipeline plan``, ``trial`` and ``verify``.

Errors are ``PipelineError`` with the command's messages. Ctrl-C stops a running write as SIGINT stops
``pipeline run``: the rows already embedded are committed, then ``KeyboardInterrupt`` is raised; run the job
again to resume.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from . import _native
from ._native import PipelineError

__all__ = [
    "PipelineError",
    "Session",
    "embed",
    "plan",
    "run",
    "sql",
    "trial",
    "verify",
    "versions",
]


def versions() -> str:
    """The versions of the pipeline, DataFusion, Lance and ONNX Runtime this package runs on."""
    return _native.versions()


def _can_draw() -> bool:
    """Whether a progress bar has somewhere to be drawn: a terminal on standard error, or a notebook. A log file
    gets none, as `pipeline run` draws none when its standard error is not a terminal."""
    if "ipykernel" in sys.modules:
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Show:
    """Shows a running operation: notes and warnings on standard error, and a progress bar of useful tokens
    (tqdm's, which draws itself in a notebook too) while a write into Lance runs. ``progress=None`` draws the
    bar where it can be drawn (a terminal, a notebook)."""

    def __init__(self, progress: bool | None, quiet: bool):
        self.progress = _can_draw() if progress is None else progress
        self.quiet = quiet
        self.bar = None

    def __call__(self, kind: str, value: Any) -> None:
        if kind == "note":
            if not self.quiet:
                self._print(value)
        elif kind == "warning":
            self._print(f"warning: {value}")
        elif kind == "write_started":
            self._close()
            if self.progress:
                self.bar = _bar()
        elif kind == "progress":
            if self.bar is not None:
                total = value.get("useful_tokens_total")
                if total and self.bar.total != total:
                    self.bar.total = total
                self.bar.n = value["useful_tokens"]
                docs = value["documents"]
                todo = value.get("documents_total")
                self.bar.set_postfix_str(f"{docs}/{todo} documents" if todo is not None else f"{docs} documents",
                                         refresh=False)
                self.bar.refresh()
        elif kind == "write_finished":
            self._close()

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _bar():
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the bar is a nicety; the run does not need it
        return None
    return tqdm(total=None, unit="tok", unit_scale=True, desc="embedding", file=sys.stderr, leave=True)


def _job(job: str | os.PathLike) -> tuple[str, str]:
    """A job as (source, SQL text): a path (``os.PathLike``, or a string naming a file) is read as
    ``pipeline run`` reads a job file; any other string is the job's SQL."""
    if isinstance(job, os.PathLike):
        path = os.fspath(job)
        return path, _native.read_job_file(path)
    if not isinstance(job, str):
        raise TypeError(f"a job is SQL text or a path to a job file, not {type(job).__name__}")
    one_line = "\n" not in job and ";" not in job
    if one_line and (os.path.isfile(job) or not any(c.isspace() for c in job.strip())):
        # A file's name (no statement is one word): read as the command reads it, with its words when it cannot.
        return job, _native.read_job_file(job)
    return "<sql>", job


def _mapping(name: str, value: Any) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} is a mapping of names to values (a dict), not {type(value).__name__}")
    return value


def _sets(sets: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    return [(str(k), _setting(v)) for k, v in _mapping("sets", sets).items()]


def _setting(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _vars(vars: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping("vars", vars).items()}


def run(
    job: str | os.PathLike,
    vars: Mapping[str, Any] | None = None,
    *,
    sets: Mapping[str, Any] | None = None,
    restart: bool = False,
    device: str | None = None,
    plan: str | os.PathLike | bool | None = None,
    progress: bool | None = None,
    quiet: bool = False,
) -> dict:
    """Run a job as ``pipeline run`` does: its statements in order, every write into Lance checked against its
    output and resumed where it stopped.

    ``job`` is the path of a job file or the job's SQL; ``vars`` fill its ``${NAME}`` variables (``--var``);
    ``sets`` apply ``embed.*`` settings before it (``--set``); ``restart`` starts every output over; ``device``
    is ``embed.device`` (cpu, cuda, cuda:N); ``plan`` is a plan directory (``--plan``), False for none
    (``--no-plan``), or None for the plan beside the output. Query results are read and dropped: use ``sql`` for them.

    Returns the run's report: rows written, each write's dataset, rows and version, documents, useful and
    processed tokens, padding efficiency, truncation, timings and the device.
    """
    source, text = _job(job)
    if plan is True:
        raise TypeError("plan is a plan directory, False for none, or None for the plan beside the output")
    plan_dir = None if plan is None or plan is False else os.fspath(plan)
    report = _native.run(source, text, _vars(vars), _sets(sets), restart, device, plan_dir, plan is False,
                         _Show(progress, quiet))
    return json.loads(report)


class Session:
    """A SQL session that keeps its tables between calls, as ``pipeline sql`` does.

    ``sets`` apply ``embed.*`` settings at the start; ``device`` is ``embed.device``.
    """

    def __init__(self, sets: Mapping[str, Any] | None = None, device: str | None = None):
        self._session = _native.Session(_sets(sets), device)

    def sql(
        self,
        query: str,
        vars: Mapping[str, Any] | None = None,
        *,
        progress: bool | None = None,
        quiet: bool = False,
    ) -> pa.Table | None:
        """Run ``query``'s statements (one or more, ``;``-separated) in this session, as ``pipeline sql`` runs
        them: a ``COPY … STORED AS LANCE`` is checked and resumed as in a job. Returns the last query's result
        as a ``pyarrow.Table`` sharing the pipeline's buffers (no copy), or None when no statement returns
        rows (SET, CREATE, a write)."""
        stream = self._session.sql(query, _vars(vars), _Show(progress, quiet))
        if stream is None:
            return None
        return pa.RecordBatchReader.from_stream(stream).read_all()


_default: Session | None = None


def sql(query: str, vars: Mapping[str, Any] | None = None, *, progress: bool | None = None,
        quiet: bool = False) -> pa.Table | None:
    """``Session.sql`` in this process's default session (made at the first call): tables created by one
    call are there for the next."""
    global _default
    if _default is None:
        _default = Session()
    return _default.sql(query, vars, progress=progress, quiet=quiet)


def embed(texts: Iterable[str], model: str | os.PathLike | None = None, *, device: str | None = None) -> np.ndarray:
    """The vectors of ``texts`` (one row each, float32), made as a campaign with the model directory ``model``
    (default: the default model, all-MiniLM-L6-v2) makes them: its tokenizer, truncation, pooling and
    normalisation."""
    if isinstance(texts, str):
        raise TypeError("embed takes a list of texts; for one text, write embed([text])")
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        texts = texts.to_pylist()
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text {i} is a {type(t).__name__}, not a str")
    vectors = _native.embed(texts, None if model is None else os.fspath(model), device)
    array = pa.array(vectors)
    # One copy, so that the array is the caller's to change (Arrow's buffers are read-only).
    return array.flatten().to_numpy(zero_copy_only=False, writable=True).reshape(len(texts), vectors.dim)


def plan(job: str | os.PathLike, vars: Mapping[str, Any] | None = None, *, units: int | None = None,
         unit_tokens: int | None = None) -> list[dict]:
    """Plan every write into Lance of the job file, as ``pipeline plan`` does: one ``{"dir", "plan"}`` each (an
    image write's plan has ``"kind": "images"``: its images counted from their headers). ``vars`` fill its
    ``${NAME}`` variables, as in ``run``."""
    return json.loads(_native.plan(os.fspath(job), _vars(vars), units, unit_tokens, _Show(False, False)))


def trial(
    job: str | os.PathLike,
    vars: Mapping[str, Any] | None = None,
    *,
    minutes: float | None = None,
    sample: int | None = None,
    save: str | os.PathLike | None = None,
    reference: str | None = None,
    memory_budget: int | None = None,
    probe: bool = True,
    name: str | None = None,
) -> dict:
    """A short trial of the job file, as ``pipeline trial`` runs one (saved to ``save``, trial.json by
    default, for ``pipeline cost``); returns its report (an image write's has ``"kind": "images"``: images/s by
    band of decoded size). ``vars`` fill the job's ``${NAME}`` variables."""
    save = None if save is None else os.fspath(save)
    return json.loads(_native.trial(os.fspath(job), _vars(vars), minutes, sample, save, reference, memory_budget, probe,
                                    name, _Show(False, False)))


def verify(
    dataset: str | os.PathLike,
    *,
    job: str | os.PathLike | None = None,
    vars: Mapping[str, Any] | None = None,
    sample: int | None = None,
    seed: int = 0,
    min_cosine: float | None = None,
    model: str | os.PathLike | None = None,
    device: str | None = None,
    id_column: str | None = None,
    column: str | None = None,
    quiet: bool = True,
) -> dict:
    """Verify a dataset as ``pipeline verify`` does (its ids against the job's corpus, its vectors, a sample
    embedded again), saving the result beside a local dataset. ``report["verdict"]`` is ``"sound"``,
    ``"findings"`` (listed in ``report["findings"]``) or ``"cannot check"``. ``vars`` fill the job's ``${NAME}``
    variables."""
    job = None if job is None else os.fspath(job)
    model = None if model is None else os.fspath(model)
    report = _native.verify(os.fspath(dataset), job, _vars(vars), sample, seed, min_cosine, model, device, id_column,
                            column, _Show(False, quiet))
    return json.loads(report)
