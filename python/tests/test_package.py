"""The Python package against the command: the same vectors, the same refusals, the same resume."""

import json
import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest

import embedding_pipeline as ep
from conftest import ROOT, write_corpus


def read_vectors(dataset):
    """(ids, vectors) of a Lance dataset, ordered by id, read through the package's own SQL."""
    s = ep.Session()
    t = s.sql(f"CREATE EXTERNAL TABLE v STORED AS LANCE LOCATION '{dataset}'; SELECT id, embedding FROM v ORDER BY id",
              progress=False)
    ids = t.column("id").to_pylist()
    vectors = np.stack(t.column("embedding").to_numpy(zero_copy_only=False))
    return ids, vectors


def interrupting(when, monkeypatch):
    """Presses ctrl-C (SIGINT to this process, as a terminal sends it) once, at the first event `when` accepts;
    returns the class, whose `sent` says whether it did."""

    class CtrlC(ep._Show):
        sent = False

        def __call__(self, kind, value):
            super().__call__(kind, value)
            if not CtrlC.sent and when(kind, value):
                CtrlC.sent = True
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(ep, "_Show", CtrlC)
    return CtrlC


def test_embed_is_the_commands_embed(pipeline, tmp_path):
    texts = ["hello", "a longer text about embedding campaigns over SQL", ""]
    got = ep.embed(texts)
    assert got.shape == (3, 384) and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5), "the default model normalises"
    o = pipeline("embed", *texts, cwd=tmp_path)
    assert o.returncode == 0, o.stderr
    command = np.array([json.loads(line)["vector"] for line in o.stdout.splitlines()], dtype=np.float32)
    np.testing.assert_array_equal(got, command)
    got[0, 0] = 1.0  # the array is the caller's
    np.testing.assert_array_equal(ep.embed(pa.array(texts[:2])), command[:2])


def test_embed_refuses_what_is_not_a_list_of_texts():
    with pytest.raises(TypeError, match=r"embed\(\[text\]\)"):
        ep.embed("hello")
    with pytest.raises(TypeError, match="text 1 is a int"):
        ep.embed(["a", 3])
    with pytest.raises(ep.PipelineError, match="no texts to embed"):
        ep.embed([])
    with pytest.raises(ep.PipelineError, match="nowhere"):
        ep.embed(["a"], model="/nowhere/model")


def test_run_writes_the_commands_vectors_and_reports(pipeline, job, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    ids = write_corpus(corpus, 120)
    o = pipeline("run", job, "--var", f"CORPUS={corpus}", "--var", f"OUT={tmp_path / 'cmd.lance'}", cwd=tmp_path)
    assert o.returncode == 0, o.stderr
    report = ep.run(job, {"CORPUS": corpus, "OUT": tmp_path / "py.lance"}, progress=False)
    assert report["rows_written"] == 120 and report["documents"] == 120
    [write] = report["writes"]
    assert write["rows"] == 120 and write["version"] >= 1 and write["uri"].endswith("py.lance")
    assert 0 < report["padding_efficiency"] <= 1 and report["useful_tokens"] <= report["processed_tokens"]
    assert report["useful_tokens_per_second"] > 0 and report["device"]["provider"] == "CPUExecutionProvider"
    cmd_ids, cmd = read_vectors(tmp_path / "cmd.lance")
    py_ids, py = read_vectors(tmp_path / "py.lance")
    assert cmd_ids == py_ids == sorted(ids)
    np.testing.assert_array_equal(py, cmd)
    # A second run resumes: nothing left to embed.
    again = ep.run(job, {"CORPUS": corpus, "OUT": tmp_path / "py.lance"}, progress=False)
    assert again["documents"] == 0 and again["rows_written"] == 0


def test_errors_carry_the_commands_messages(pipeline, job, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    write_corpus(corpus, 5)
    bad = tmp_path / "bad.sql"
    bad.write_text("SELECT 1;\nSELECT * FROM nowhere;\n")
    o = pipeline("run", bad, cwd=tmp_path)
    assert o.returncode != 0
    with pytest.raises(ep.PipelineError) as e:
        ep.run(bad, progress=False)
    assert f"error: {e.value}" in o.stderr, (str(e.value), o.stderr)
    assert "statement 2 (line 2)" in str(e.value) and "nowhere" in str(e.value)
    # A variable the job needs and was not given.
    with pytest.raises(ep.PipelineError, match=r"\$\{OUT\} has no value"):
        ep.run(job, {"CORPUS": corpus}, progress=False)
    # A job path that names no file, and SQL given as the job.
    o = pipeline("run", "jobs/missing.sql", cwd=tmp_path)
    with pytest.raises(ep.PipelineError) as e:
        ep.run("jobs/missing.sql")
    assert f"error: {e.value}" in o.stderr and "jobs/missing.sql" in str(e.value), (str(e.value), o.stderr)
    with pytest.raises(ep.PipelineError, match="`1X` is not a variable name"):
        ep.run(job, {"1X": "a"})
    with pytest.raises(ep.PipelineError, match="`batch_tokens` is not a setting's name"):
        ep.run(job, {"CORPUS": corpus, "OUT": tmp_path / "o.lance"}, sets={"batch_tokens": 8192})
    with pytest.raises(TypeError, match="vars is a mapping"):
        ep.run(job, [("CORPUS", corpus)])
    # One word is a job file's name, never SQL: the command's words when it is not there.
    o = pipeline("run", "nofile.txt", cwd=tmp_path)
    with pytest.raises(ep.PipelineError) as e:
        ep.run("nofile.txt")
    assert f"error: {e.value}" in o.stderr, (str(e.value), o.stderr)
    assert ep.run("SELECT 1", progress=False)["rows_written"] == 0


def test_a_repeated_id_is_refused_through_run_and_sql(pipeline, job, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    write_corpus(corpus, 20, repeat="art:0")
    out = tmp_path / "dup.lance"
    o = pipeline("run", job, "--var", f"CORPUS={corpus}", "--var", f"OUT={out}", cwd=tmp_path)
    assert o.returncode != 0 and "art:0" in o.stderr, o.stderr
    with pytest.raises(ep.PipelineError, match="art:0") as e:
        ep.run(job, {"CORPUS": corpus, "OUT": out}, progress=False)
    assert f"error: {e.value}" in o.stderr.replace(str(job), str(job)), (str(e.value), o.stderr)
    s = ep.Session()
    s.sql(f"CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{corpus}'")
    with pytest.raises(ep.PipelineError, match="art:0"):
        s.sql(f"COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{tmp_path / 'dup2.lance'}' STORED AS LANCE")


def test_ctrl_c_stops_a_run_that_resumes_to_every_id_once(job, tmp_path, monkeypatch):
    corpus = tmp_path / "docs.jsonl"
    ids = write_corpus(corpus, 1000)
    out = tmp_path / "out.lance"
    ctrl_c = interrupting(lambda kind, value: kind == "progress" and value["documents"] > 0, monkeypatch)
    vars = {"CORPUS": corpus, "OUT": out}
    with pytest.raises(KeyboardInterrupt, match=r"interrupted: \d+ rows committed to .*out.lance.*run the same job again"):
        ep.run(job, vars, sets={"embed.commit_rows": 50})
    assert ctrl_c.sent
    monkeypatch.undo()
    first, _ = read_vectors(out)
    assert 0 < len(first) < 1000, len(first)
    report = ep.run(job, vars, progress=False)
    assert report["documents"] == 1000 - len(first)
    done, vectors = read_vectors(out)
    assert done == sorted(ids) and len(set(done)) == 1000, "every id exactly once"
    assert vectors.shape == (1000, 384)


def test_ctrl_c_on_a_restart_is_resumed_by_the_same_restart(job, tmp_path, monkeypatch, capsys):
    """Issue 53 through the package: ep.run(restart=True) stopped after a commit, then run again with restart=True,
    resumes the restart that stopped (its rows kept) instead of replacing them."""
    corpus = tmp_path / "docs.jsonl"
    ids = write_corpus(corpus, 1000)
    out = tmp_path / "out.lance"
    vars = {"CORPUS": corpus, "OUT": out}
    ctrl_c = interrupting(lambda kind, value: kind == "progress" and value["documents"] > 0, monkeypatch)
    with pytest.raises(KeyboardInterrupt, match=r"\d+ rows committed to .*out.lance.*with or without --restart"):
        ep.run(job, vars, sets={"embed.commit_rows": 50}, restart=True)
    assert ctrl_c.sent
    monkeypatch.undo()
    kept, _ = read_vectors(out)
    assert 0 < len(kept) < 1000, len(kept)
    capsys.readouterr()
    report = ep.run(job, vars, restart=True, progress=False)
    assert report["documents"] == 1000 - len(kept), report
    said = capsys.readouterr().err
    assert "resuming the restart of" in said and f"resuming: {len(kept)} of 1000" in said, said
    done, _ = read_vectors(out)
    assert done == sorted(ids) and len(set(done)) == 1000, "every id exactly once"


def test_sql_returns_arrow_without_a_copy(tmp_path, job):
    corpus = tmp_path / "docs.jsonl"
    write_corpus(corpus, 200)
    ep.run(job, {"CORPUS": corpus, "OUT": tmp_path / "v.lance"}, progress=False)
    before = pa.total_allocated_bytes()
    t = ep.sql(f"CREATE EXTERNAL TABLE v200 STORED AS LANCE LOCATION '{tmp_path / 'v.lance'}'; SELECT * FROM v200")
    assert isinstance(t, pa.Table) and t.num_rows == 200
    assert t.schema.field("embedding").type.list_size == 384
    # pyarrow's allocator made none of the table's buffers: they are the pipeline's, shared.
    assert pa.total_allocated_bytes() - before < t.nbytes / 100, (pa.total_allocated_bytes() - before, t.nbytes)
    # The very buffers: every one pyarrow's table holds is one the pipeline's result held.
    stream = ep._default._session.sql("SELECT id, embedding FROM v200", {}, None)
    produced = set(stream.buffer_addresses())
    read = pa.RecordBatchReader.from_stream(stream).read_all()
    held = {b.address for column in read.columns for chunk in column.chunks for b in chunk.buffers()
            if b is not None and b.size > 0}
    assert held and held <= produced, (len(held), len(held - produced))
    with pytest.raises(ep.PipelineError, match="already read"):
        stream.__arrow_c_stream__()
    # The default session keeps its tables.
    assert ep.sql("SELECT count(*) AS n FROM v200").column("n").to_pylist() == [200]
    assert ep.sql("SET embed.batch_tokens = 4096") is None


def test_plan_trial_and_verify_return_the_commands_reports(pipeline, tmp_path, monkeypatch):
    corpus = tmp_path / "docs.jsonl"
    write_corpus(corpus, 100)
    # The job's folder is a variable, given to every call as `--var` gives it to the command.
    job = tmp_path / "job.sql"
    job.write_text(
        f"SET embed.model = '{ROOT / 'models' / 'all-MiniLM-L6-v2'}';\n"
        "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '${DIR}/docs.jsonl';\n"
        "COPY (SELECT id, embed(text) AS embedding FROM docs) TO '${DIR}/out.lance' STORED AS LANCE;\n"
    )
    with pytest.raises(ep.PipelineError, match=r"job.sql line 2: \$\{DIR\} has no value"):
        ep.plan(job)
    at = {"DIR": tmp_path}
    [planned] = ep.plan(job, at)
    assert planned["plan"]["totals"]["rows"] == 100 and os.path.isdir(planned["dir"])
    t = ep.trial(job, at, sample=40, save=tmp_path / "trial.json")
    assert (tmp_path / "trial.json").exists() and t["fingerprint"]["dim"] == 384
    ep.run(job, at, progress=False)
    # Ctrl-C at verify's first stage: it stops there and saves nothing, as `pipeline verify` on SIGINT.
    interrupted = interrupting(lambda kind, value: kind == "note", monkeypatch)
    with pytest.raises(KeyboardInterrupt, match="verify of .*out.lance stopped before its end"):
        ep.verify(tmp_path / "out.lance", job=job, vars=at, sample=20)
    assert interrupted.sent and not (tmp_path / "out.lance.verify.json").exists()
    monkeypatch.undo()
    report = ep.verify(tmp_path / "out.lance", job=job, vars=at, sample=20)
    assert report["verdict"] == "sound", report
    assert report["rows"] == 100 and (tmp_path / "out.lance.verify.json").exists()
    with pytest.raises(ep.PipelineError, match="nowhere.lance"):
        ep.verify(tmp_path / "nowhere.lance")


def test_ctrl_c_in_a_terminal_stops_the_run_as_sigint_stops_the_command(job, tmp_path):
    """A real ctrl-C: SIGINT to a Python process running ep.run, while Python waits (not in its callback)."""
    corpus = tmp_path / "docs.jsonl"
    ids = write_corpus(corpus, 1000)
    out = tmp_path / "out.lance"
    script = (
        "import sys, embedding_pipeline as ep\n"
        "ep.run(sys.argv[1], {'CORPUS': sys.argv[2], 'OUT': sys.argv[3]}, sets={'embed.commit_rows': 50},\n"
        "       progress=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(job), str(corpus), str(out)],
                            stderr=subprocess.PIPE, text=True, bufsize=1)
    seen = ""
    while not re.search(r"[1-9][0-9]*/1000 documents", seen):  # the bar shows documents embedded
        ch = proc.stderr.read(1)
        if not ch:
            break
        seen += ch
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) != 0
    assert "stopping: committing the rows already embedded" in rest, rest
    assert "KeyboardInterrupt: " in rest and "rows committed to" in rest, rest[-2000:]
    first, _ = read_vectors(out)
    assert len(first) < 1000
    ep.run(job, {"CORPUS": corpus, "OUT": out}, progress=False)
    done, _ = read_vectors(out)
    assert done == sorted(ids), "every id exactly once"


def test_ctrl_c_stops_embed_and_the_next_call_runs():
    texts = [f"text number {i}, " + "with some words " * 20 for i in range(20000)]
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt, match="embed stopped before its end, as asked; nothing was kept"):
            ep.embed(texts)
    finally:
        timer.cancel()
    # The stop was honoured and cleared: the next call embeds.
    assert ep.embed(["after the stop"]).shape == (1, 384)


def test_an_install_waiting_on_another_build_says_so(tmp_path):
    """`pip install ./python` behind another build's lock on the shared target directory says it is waiting
    (it waited 10 minutes in silence, issue 53 item 13); with the lock free it says nothing."""
    import fcntl
    import io

    sys.path.insert(0, str(ROOT / "python" / "build_backend"))
    import backend

    (tmp_path / "debug").mkdir()
    said = io.StringIO()
    assert not backend.say_if_waiting(str(tmp_path), said) and said.getvalue() == ""
    with open(tmp_path / "debug" / ".cargo-lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        # flock locks belong to the open file: the backend's own open of the file is refused while this one holds it.
        assert backend.say_if_waiting(str(tmp_path), said)
    assert str(tmp_path) in said.getvalue() and "waits for it to finish" in said.getvalue()
