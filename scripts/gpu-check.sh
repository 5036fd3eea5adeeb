#!/usr/bin/env bash
# The GPU check: the same documents embedded on the CPU and on CUDA, by the pipeline and by the bare ONNX
# Runtime session on the same batches, with useful tokens/s for each and the CPU-vs-GPU cosine (target
# >= 0.9999). Made for a GPU machine with no Rust toolchain and no network, in one call of at most 8 minutes:
# it runs what scripts/gpu-bundle packed (see there for how the parts travel).
#
#   bash scripts/gpu-check.sh [BUNDLE_DIR]      # default .gpu-bundle; the full check
#   bash scripts/gpu-check.sh --receive         # only say which bundle parts have arrived
#
# ONNX Runtime: if this machine's own Python `onnxruntime` is 1.31 or newer and has the CUDA provider, its
# library is used; otherwise the onnxruntime-gpu 1.31.1 libraries from the bundle. The report says which,
# and why the machine's own could or could not be used. CUDA 13 and cuDNN 9 libraries are taken from the
# machine: NVIDIA's Python packages (site-packages/nvidia/*/lib) and /usr/local/cuda.
#
# On a machine without a GPU it runs the CPU half and says plainly why CUDA was not run.
# Figures go to $OUT (the device tool's folder) or out/gpu-check/: gpu-check.md, gpu-check.json, logs.txt.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RECEIVE=0
BUNDLE=.gpu-bundle
for arg in "$@"; do
  case "$arg" in
    --receive) RECEIVE=1 ;;
    -*) echo "usage: scripts/gpu-check.sh [--receive] [BUNDLE_DIR]" >&2; exit 2 ;;
    *) BUNDLE="$arg" ;;
  esac
done
# The whole check must end inside one device call (10 minutes at most): every step gets what is left of
# a 7-minute deadline, at most 150 s, and is killed 15 s after its time (pipeline run commits on SIGTERM,
# which a stuck GPU call could hold up).
DEADLINE=$(( SECONDS + ${GPU_CHECK_SECONDS:-420} ))
step_time() {
  local left=$(( DEADLINE - SECONDS - 20 ))
  (( left > ${GPU_CHECK_STEP_SECONDS:-150} )) && left=${GPU_CHECK_STEP_SECONDS:-150}
  echo "$left"
}
limited() { local t; t=$(step_time); (( t > 5 )) || { note "skipped (the check's 7 minutes are spent): $*"; return 124; }
  timeout -k 15 "$t" "$@"; }

missing_parts() {
  [ -f "$BUNDLE/bundle.sha256" ] || echo "bundle.sha256"
  [ -f "$BUNDLE/bundle.parts" ] || { echo "bundle.parts"; return; }
  while read -r part; do [ -f "$BUNDLE/$part" ] || echo "$part"; done < "$BUNDLE/bundle.parts"
}
if [ "$RECEIVE" = 1 ]; then
  echo "gpu-check: in $BUNDLE: $(cd "$BUNDLE" 2>/dev/null && ls bundle.tar.xz.* 2>/dev/null | tr '\n' ' ')"
  m=$(missing_parts); echo "gpu-check: still missing: ${m:-nothing}"
  exit 0
fi

REPORT="${OUT:-$ROOT/out/gpu-check}"
mkdir -p "$REPORT"
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOG="$REPORT/logs.txt"
: > "$LOG"
note() { echo "gpu-check: $*" | tee -a "$LOG"; }
fail() {
  note "STOPPED: $*"
  printf '# GPU check\n\nStopped: %s\n' "$*" > "$REPORT/gpu-check.md"
  printf '{"stopped": "%s"}\n' "$(printf '%s' "$*" | sed 's/["\\]/\\&/g')" > "$REPORT/gpu-check.json"
  exit 1
}

# 1. The bundle.
m=$(missing_parts)
[ -z "$m" ] || fail "bundle parts missing in $BUNDLE: $(echo $m). Run scripts/gpu-bundle here and send every part."
want=$(cat "$BUNDLE/bundle.sha256")
got=$(cd "$BUNDLE" && cat $(cat bundle.parts) | sha256sum | cut -d' ' -f1)
[ "$want" = "$got" ] || fail "bundle sha256 is $got, expected $want: a part is damaged or from another bundle"
if command -v xz >/dev/null; then
  (cd "$BUNDLE" && cat $(cat bundle.parts)) | xz -d -T0 | tar -C "$WORK" -xf - || fail "cannot unpack the bundle"
else
  (cd "$BUNDLE" && cat $(cat bundle.parts)) | python3 -c 'import lzma, sys, shutil; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)' \
    | tar -C "$WORK" -xf - || fail "cannot unpack the bundle"
fi
note "bundle: $(tr '\n' ';' < "$WORK/BUNDLE")"
PIPELINE="$WORK/bin/pipeline"
BARE="$WORK/bin/bare_session"
MODEL="$WORK/model/all-MiniLM-L6-v2"
# The float32 export where the bundle has it: the same file on the CPU and the GPU, so their vectors compare
# (the int8 default's quantisation nodes have no CUDA kernels, and the placement check refuses it on CUDA).
[ -f "$WORK/model/all-MiniLM-L6-v2-fp32/onnx/model.onnx" ] && MODEL="$WORK/model/all-MiniLM-L6-v2-fp32"
note "model: $(basename "$MODEL")"
CORPUS="$WORK/corpus.jsonl"
DOCS=$(wc -l < "$CORPUS")
THREADS=$(nproc)

# 2. ONNX Runtime and the CUDA libraries.
PY_ORT=$(python3 - <<'PY' 2>/dev/null
import os
try:
    import onnxruntime as o
    print(o.__version__, "CUDAExecutionProvider" in o.get_available_providers(), os.path.join(os.path.dirname(o.__file__), "capi"))
except Exception as e:
    print("none", False, "-", type(e).__name__)
PY
)
read -r PY_ORT_VERSION PY_ORT_CUDA PY_ORT_DIR _ <<< "${PY_ORT:-none False -}"
PY_ORT_LIB=$(ls "$PY_ORT_DIR"/libonnxruntime.so.* 2>/dev/null | head -1)
new_enough=$(python3 -c "import sys; v=[int(x) for x in '$PY_ORT_VERSION'.split('.')[:2] if x.isdigit()]; print(len(v)==2 and v>=[1,31])" 2>/dev/null)
if [ "$PY_ORT_CUDA" = True ] && [ "$new_enough" = True ] && [ -n "$PY_ORT_LIB" ]; then
  ORT_LIB="$PY_ORT_LIB"; ORT_SOURCE="this machine's Python onnxruntime $PY_ORT_VERSION (it has the CUDA provider)"
elif [ -f "$WORK/ort/libonnxruntime.so.1.31.1" ]; then
  ORT_LIB="$WORK/ort/libonnxruntime.so.1.31.1"
  why="its version is $PY_ORT_VERSION"
  [ "$PY_ORT_VERSION" = none ] && why="it has none"
  [ "$PY_ORT_CUDA" = True ] || why="$why, without the CUDA provider"
  [ "$new_enough" = True ] || why="$why (1.31 or newer is needed: the binary uses ONNX Runtime's API 31)"
  ORT_SOURCE="the bundle's onnxruntime-gpu 1.31.1; this machine's Python onnxruntime could not be used: $why"
else
  fail "no usable ONNX Runtime: the bundle has none (--no-ort) and this machine's Python onnxruntime is '$PY_ORT_VERSION' (CUDA provider: $PY_ORT_CUDA)"
fi
note "ONNX Runtime: $ORT_SOURCE"
CUDA_DIRS=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = set()
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for lib in glob.glob(os.path.join(base, "nvidia", "**", "lib*.so*"), recursive=True):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
PY
)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && CUDA_DIRS="$CUDA_DIRS:$d"; done
export LD_LIBRARY_PATH="$(dirname "$ORT_LIB")${CUDA_DIRS:+:$CUDA_DIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export EMBED_PIPELINE_HOME="$WORK/home"   # nothing installed there: the libraries come from the paths above
note "CUDA library folders: ${CUDA_DIRS:-none found}"
command -v nvidia-smi >/dev/null && timeout -k 5 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$LOG" 2>&1
timeout -k 5 60 "$PIPELINE" devices --ort-lib "$ORT_LIB" --json > "$WORK/devices.json" 2>> "$LOG"
cat "$WORK/devices.json" >> "$LOG"
HAS_GPU=$(python3 -c "import json; d=json.load(open('$WORK/devices.json')); print(bool(d.get('cuda_provider')) and bool((d.get('nvidia') or {}).get('gpus')))" 2>/dev/null)

# 3. The runs. run NAME DEVICE BATCH_TOKENS [MODEL_DIR CORPUS]: the pipeline over every document into NAME.lance.
run() {
  local name=$1 device=$2 budget=$3 model=${4:-$MODEL} corpus=${5:-$CORPUS}
  cat > "$WORK/$name.sql" <<SQL
SET embed.model = '$model';
SET embed.intra_threads = $THREADS;
SET embed.batch_tokens = $budget;
CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '$corpus';
COPY (SELECT id, embed(text) AS embedding FROM docs) TO '$WORK/$name.lance' STORED AS LANCE;
SQL
  note "pipeline $name: $device, batch_tokens $budget"
  limited "$PIPELINE" run --ort-lib "$ORT_LIB" --device "$device" "$WORK/$name.sql" >> "$LOG" 2>&1 \
    && timeout -k 5 60 "$PIPELINE" inspect "$WORK/$name.lance" --json > "$WORK/$name.inspect.json" 2>> "$LOG" \
    || note "pipeline $name failed (rc $?)"
}
# bare NAME DEVICE BATCH_TOKENS: the bare session on the same batches.
bare() {
  local name=$1 device=$2 budget=$3
  note "bare session $name: $device, batch_tokens $budget"
  limited "$BARE" "$CORPUS" "$DOCS" "$MODEL" "$budget" "$THREADS" "$device" \
    > "$WORK/bare-$name.json" 2>> "$LOG" || note "bare session $name failed (rc $?)"
}
export ORT_DYLIB_PATH="$ORT_LIB"   # for bare_session, which loads ONNX Runtime the pipeline's way
if [ "${GPU_CHECK_ONLY:-}" = decoder ]; then
  CUDA_NOTE=""   # GPU_CHECK_ONLY=decoder: section 4 alone (a second call in the same lease)
else
run cpu cpu 2048
bare cpu cpu 2048
if [ "$HAS_GPU" = True ]; then
  for budget in 2048 16384; do
    run "cuda-$budget" cuda:0 "$budget"
    bare "cuda-$budget" cuda:0 "$budget"
    limited "$PIPELINE" compare "$WORK/cpu.lance" "$WORK/cuda-$budget.lance" --json --min-cosine 0.9999 \
      > "$WORK/compare-$budget.json" 2>> "$LOG" || note "compare cpu vs cuda-$budget: rc $? (see the report)"
  done
  CUDA_NOTE=""
else
  CUDA_NOTE="CUDA was not run: $(python3 -c "import json; d=json.load(open('$WORK/devices.json')); print(d.get('nvidia_error') or ('the ONNX Runtime library has no CUDA provider' if not d.get('cuda_provider') else 'no GPU'))" 2>/dev/null || echo 'pipeline devices failed')"
  note "$CUDA_NOTE"
fi
fi

# 4. A decoder's 48 GB split measured on the GPU (issue 34): a Qwen3 decoder at Qwen3-Embedding-0.6B's size (random
# weights: memory and speed do not depend on their values), built by tests/fixtures/make_st_shapes.py and exported
# in float32 by scripts/export_onnx.py with this machine's own torch and sentence-transformers, when it has them.
# Then `pipeline probe` on CUDA (weights, the session after load and each step's working memory, from NVML), a
# run over every document on CUDA, and the first DECODER_CPU_DOCS documents on the CPU and on CUDA compared
# (DECODER_CPU_DOCS=0: not compared). DECODER_SHAPE=qwen3-1.7b and DECODER_DTYPE=float16 take the larger decoder in
# float16, whose export is above 2 GB (external data).
DECODER_NOTE=""
DECODER_SHAPE="${DECODER_SHAPE:-qwen3-0.6b}"
DECODER_DTYPE="${DECODER_DTYPE:-float32}"
DECODER_MODEL="$WORK/$DECODER_SHAPE-$DECODER_DTYPE"
if [ "$HAS_GPU" != True ]; then
  DECODER_NOTE="the decoder was not run: no GPU"
elif ! python3 -c 'import torch, sentence_transformers, onnx' 2>> "$LOG"; then
  DECODER_NOTE="the decoder was not run: this machine's python3 lacks torch, sentence-transformers or onnx"
else
  note "decoder: building $DECODER_SHAPE and exporting it in $DECODER_DTYPE"
  if (cd "$WORK" && limited python3 "$ROOT/tests/fixtures/make_st_shapes.py" "$DECODER_SHAPE" "$WORK/model/all-MiniLM-L6-v2" \
        "$WORK/ckpt-$DECODER_SHAPE" </dev/null >> "$LOG" 2>&1) \
     && limited python3 "$ROOT/scripts/export_onnx.py" --pipeline "$PIPELINE" --dtype "$DECODER_DTYPE" \
        "$WORK/ckpt-$DECODER_SHAPE" "$DECODER_MODEL" > "$REPORT/decoder-export.txt" 2>&1; then
    ls -la "$DECODER_MODEL/onnx" >> "$REPORT/decoder-export.txt"
    cat > "$WORK/decoder-probe.sql" <<SQL
SET embed.model = '$DECODER_MODEL';
SET embed.device = 'cuda:0';
CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '$CORPUS';
COPY (SELECT id, embed(text) AS embedding FROM docs) TO '$WORK/decoder-probe.lance' STORED AS LANCE;
SQL
    note "decoder: pipeline probe on cuda:0"
    limited "$PIPELINE" probe --ort-lib "$ORT_LIB" "$WORK/decoder-probe.sql" --max-batch-tokens "${DECODER_MAX_BATCH_TOKENS:-65536}" \
      > "$REPORT/decoder-probe.txt" 2>&1 || note "decoder probe failed (rc $?)"
    run decoder-cuda cuda:0 16384 "$DECODER_MODEL"
    if [ "${DECODER_CPU_DOCS:-200}" -gt 0 ]; then
      head -n "${DECODER_CPU_DOCS:-200}" "$CORPUS" > "$WORK/decoder-sample.jsonl"
      run decoder-cuda-sample cuda:0 16384 "$DECODER_MODEL" "$WORK/decoder-sample.jsonl"
      run decoder-cpu-sample cpu 2048 "$DECODER_MODEL" "$WORK/decoder-sample.jsonl"
      limited "$PIPELINE" compare "$WORK/decoder-cpu-sample.lance" "$WORK/decoder-cuda-sample.lance" --json --min-cosine 0.9999 \
        > "$WORK/compare-decoder.json" 2>> "$LOG" || note "compare decoder cpu vs cuda: rc $? (see the report)"
    fi
  else
    DECODER_NOTE="the decoder was not run: building or exporting it failed (see decoder-export.txt and logs.txt)"
  fi
fi
[ -z "$DECODER_NOTE" ] || note "$DECODER_NOTE"

# 5. The report.
python3 - "$WORK" "$REPORT" "$ORT_SOURCE" "$CUDA_NOTE" "$DOCS" "$THREADS" "$DECODER_NOTE" "$DECODER_SHAPE $DECODER_DTYPE" <<'PY'
import glob, json, os, sys
work, report, ort_source, cuda_note, docs, threads, decoder_note, decoder = sys.argv[1:9]
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
devices = load(f"{work}/devices.json") or {}
rows, figures = [], {"documents": int(docs), "cpu_threads": int(threads), "onnxruntime": ort_source,
                     "devices": devices, "bundle": open(f"{work}/BUNDLE").read().strip().splitlines()}
if cuda_note:
    figures["cuda_not_run"] = cuda_note
cpu_tps = None
compares = {"cuda-2048": "compare-2048", "cuda-16384": "compare-16384", "decoder-cuda-sample": "compare-decoder"}
for name in ["cpu", "cuda-2048", "cuda-16384", "decoder-cpu-sample", "decoder-cuda-sample", "decoder-cuda"]:
    inspect, bare = load(f"{work}/{name}.inspect.json"), load(f"{work}/bare-{name}.json")
    if inspect is None and bare is None:
        continue
    versions = (inspect or {}).get("versions") or [{}]
    run = versions[-1].get("run") or {}
    pipe_tps = run.get("useful_tokens_per_second")
    bare_tps = (bare or {}).get("useful_tokens_per_second")
    if name in ("cpu", "decoder-cpu-sample"):
        cpu_tps = pipe_tps
    cmp = load(f"{work}/{compares[name]}.json") if name in compares else None
    entry = {"pipeline_useful_tokens_per_second": pipe_tps, "bare_session_useful_tokens_per_second": bare_tps,
             "pipeline_over_bare": pipe_tps / bare_tps if pipe_tps and bare_tps else None,
             "padding_efficiency": run.get("padding_efficiency"), "wall_seconds": run.get("wall_seconds"),
             "device": (run.get("device") or {}), "min_cosine_vs_cpu": (cmp or {}).get("min_cosine"),
             "mean_cosine_vs_cpu": (cmp or {}).get("mean_cosine"), "max_abs_diff_vs_cpu": (cmp or {}).get("max_abs_diff")}
    figures[name] = entry
    f = lambda v, p=0: "n/a" if v is None else f"{v:,.{p}f}"
    rows.append(f"| {name} | {f(pipe_tps)} | {f(bare_tps)} | {f(entry['pipeline_over_bare'], 2)} | "
                f"{f(pipe_tps / cpu_tps if pipe_tps and cpu_tps else None, 1)} | {f(entry['min_cosine_vs_cpu'], 6)} |")
json.dump(figures, open(f"{report}/gpu-check.json", "w"), indent=2, default=str)
gpus = ", ".join(f"{g['name']} (compute {g['compute_capability']}, {g['memory_mib']} MiB)"
                 for g in (devices.get("nvidia") or {}).get("gpus", [])) or "none"
nv = devices.get("nvidia") or {}
md = [
    "# GPU check", "",
    f"{docs} documents; CPU runs with {threads} threads. GPUs: {gpus}; driver {nv.get('driver_version', 'n/a')} "
    f"(CUDA {nv.get('cuda_driver_version', 'n/a')}).", "",
    f"ONNX Runtime: {ort_source}.", "",
    f"Bundle: {'; '.join(figures['bundle'])}.", "",
    "| run | pipeline useful tok/s | bare session useful tok/s | pipeline / bare | x CPU pipeline | min cosine vs CPU |",
    "|---|---|---|---|---|---|", *rows, "",
    "Pipeline figures are useful tokens over the write's wall time (model load and the probe batch included);",
    "the bare session times only Session::run on the same batches, after one untimed call. On CUDA the bare session",
    "runs the unmodified graph and copies every token's state back, while the pipeline pools inside the graph,",
    "so the pipeline can beat this floor there.",
]
for name in ["cuda-2048", "cuda-16384"]:
    cuda = ((figures.get(name) or {}).get("device") or {}).get("cuda") or {}
    if cuda:
        md += ["", f"{name}: inputs in {cuda.get('input_memory') or 'n/a'}; "
                   f"CUDA runtime {cuda.get('cuda_runtime_version')}, cuDNN {cuda.get('cudnn_version')}."]
if cuda_note:
    md += ["", f"**{cuda_note}**"]
md += ["", "## A decoder's 48 GB split, measured on the GPU", ""]
if decoder_note:
    md += [f"**{decoder_note}**"]
else:
    sample = (figures.get("decoder-cpu-sample") or {})
    md += [f"A Qwen3 decoder (shape and dtype: {decoder}; random weights, last-token pooling), built by",
           "tests/fixtures/make_st_shapes.py and exported by scripts/export_onnx.py on this machine.",
           "Rows decoder-*-sample embed the same first documents on the CPU and on CUDA (x CPU pipeline and the cosine",
           "are against decoder-cpu-sample); decoder-cuda embeds every document. `pipeline probe` on cuda:0:", "", "```"]
    try:
        md += [l.rstrip() for l in open(f"{report}/decoder-probe.txt")]
    except OSError:
        md += ["(no probe output)"]
    md += ["```"]
    try:
        md += ["", "Export: " + "; ".join(l.strip() for l in open(f"{report}/decoder-export.txt") if "verified on" in l)]
    except OSError:
        pass
open(f"{report}/gpu-check.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
