"""Fine-tune a sentence-transformers checkpoint on pairs, measure the memory of its longest batch first, and write
the checkpoint with its training record. Run by scripts/adapt inside the exporter's environment; see that script
for usage.

Memory is measured, not guessed: one forward, backward and optimizer step on the batch with the most tokens.
Weights, gradients and optimizer states are the bytes of those tensors; activations are the bytes of the tensors
autograd saves for backward (each storage once, parameters left to the weights), followed as they are freed, so
their peak is the most held at once. The same hooks work on CPU and CUDA; on CUDA the allocator's own
max_memory_allocated is reported beside the sum.
"""

import argparse
import copy
import datetime
import hashlib
import json
import math
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_onnx  # noqa: E402  (the training-data digests and weight hashes, as the export records them)

GIB = 1 << 30
MIB = 1 << 20
RECORD_FILE = "training.json"
RECORD_FORMAT = "embedding-pipeline:training/1"
CARDS_GIB = (48, 80)
# What a CUDA process holds besides its tensors (context, cuBLAS workspace), kept out of a card's usable memory.
CUDA_RESERVE = 1 * GIB


def fail(message):
    print(f"adapt: error: {message}", file=sys.stderr)
    sys.exit(1)


def say(message):
    print(f"adapt: {message}", file=sys.stderr, flush=True)


# The export's helpers speak for this script when they fail.
export_onnx.fail = fail
export_onnx.say = say


def size(n):
    if n is None:
        return "-"
    return f"{n / GIB:,.2f} GiB" if n >= GIB else f"{n / MIB:,.1f} MiB"


# ---------------------------------------------------------------------------------------------------------------
# Training data


def read_pairs(args):
    """The pairs and the training-data record (as lineage.json has it): a Lance version, Parquet or JSON lines."""
    uri, _ = export_onnx.split_at(args.pairs)
    if "://" not in uri and not Path(uri).exists():
        fail(f"--pairs {args.pairs}: {uri} not found (a Lance dataset, Parquet, or JSON lines of pairs)")
    data_input = export_onnx.training_data(args.pairs)
    data = {k: v for k, v in data_input["facets"]["embeddingPipeline_trainingData"].items()
            if not k.startswith("_") and k != "role"}
    if data["kind"] == "remote":
        fail(f"--pairs {args.pairs}: training reads local data (a Lance dataset, Parquet or JSON lines), so that "
             f"the record can pin the version it read; copy it here first")
    path = Path(data["uri"])
    if data["kind"] == "lance":
        import lance

        rows = lance.dataset(str(path), version=data["version"]).to_table().to_pylist()
        where = f"{path}@{data['version']}"
    elif path.suffix == ".parquet" or (path.is_dir() and any(path.rglob("*.parquet"))):
        import pyarrow.parquet as pq

        rows = pq.read_table(str(path)).to_pylist()
        where = str(path)
    elif path.is_file():
        rows = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path} line {n}: not JSON ({e}); pairs are JSON lines, one object a line")
                if not isinstance(value, dict):
                    fail(f"{path} line {n}: expected an object with the pair's columns")
                rows.append(value)
        where = str(path)
    else:
        fail(f"--pairs {args.pairs}: a folder without Parquet files; give a Lance dataset, Parquet or JSON lines")
    if not rows:
        fail(f"{where}: no pairs")
    present = list(rows[0].keys())

    def column(given, defaults, role, required=True):
        if given:
            if given not in present:
                fail(f"{where}: no column '{given}' for the {role} (columns: {', '.join(present)})")
            return given
        for name in defaults:
            if name in present:
                return name
        if required:
            fail(f"{where}: no {role} column ({' or '.join(defaults)}; columns: {', '.join(present)}); "
                 f"name it with --{role}")
        return None

    columns = [column(args.anchor, ("anchor", "query"), "anchor"), column(args.positive, ("positive",), "positive")]
    negative = column(args.negative, ("negative",), "negative", required=False)
    if negative:
        columns.append(negative)
    pairs = []
    digest = hashlib.sha256()
    for i, row in enumerate(rows):
        texts = [row.get(c) for c in columns]
        for c, t in zip(columns, texts):
            if not isinstance(t, str) or not t.strip():
                fail(f"{where} row {i}: column '{c}' is {t!r}; every pair needs a text in "
                     f"{', '.join(columns)} (drop or fill that row)")
        pairs.append(texts)
        digest.update(json.dumps(texts, ensure_ascii=False).encode() + b"\n")
    data.update(columns=columns, rows=len(pairs), rows_sha256=digest.hexdigest())
    return pairs, data


# ---------------------------------------------------------------------------------------------------------------
# Memory


class SavedTensors:
    """The bytes of the tensors autograd keeps for backward, held now and at their most. Each storage counts once
    however many tensors view it; the model's parameters and buffers are the weights' and are not counted."""

    def __init__(self, torch, model):
        self.torch = torch
        self.skip = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
        self.live = {}
        self.now = 0
        self.peak = 0

    def __enter__(self):
        self.hooks = self.torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self.hooks.__exit__(*exc)

    def pack(self, t):
        if t.layout != self.torch.strided or t.device.type == "meta":
            return t
        storage = t.untyped_storage()
        if storage.data_ptr() in self.skip or storage.nbytes() == 0:
            return t
        key = (str(t.device), storage.data_ptr())
        entry = self.live.get(key)
        if entry:
            entry[1] += 1
        else:
            self.live[key] = [storage.nbytes(), 1]
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        return _Held(self, key, t)

    def unpack(self, held):
        return held.t if isinstance(held, _Held) else held

    def release(self, key):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]
            self.now -= entry[0]


class _Held:
    """A saved tensor, which tells its counter when autograd lets it go."""

    __slots__ = ("owner", "key", "t")

    def __init__(self, owner, key, t):
        self.owner, self.key, self.t = owner, key, t

    def __del__(self):
        self.owner.release(self.key)


def token_lengths(tokenizer, texts, max_len):
    ids = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_len)["input_ids"]
    return [len(i) for i in ids]


def longest_batch(model, pairs, batch_size, max_len):
    """The worst batch a shuffle can draw: the longest anchors with the longest positives (and negatives), each
    column padded to its longest as the batch would be."""
    columns = list(zip(*pairs))
    batch, longest, padded, real = [], [], 0, 0
    for texts in columns:
        lengths = token_lengths(model.tokenizer, list(texts), max_len)
        top = sorted(range(len(texts)), key=lambda i: -lengths[i])[:batch_size]
        batch.append([texts[i] for i in top])
        longest.append(lengths[top[0]])
        padded += len(top) * longest[-1]
        real += sum(lengths[i] for i in top)
    return batch, {"pairs": len(batch[0]), "padded_tokens": padded, "tokens": real, "longest": longest}


def features(model, texts_by_column, device):
    out = []
    for texts in texts_by_column:
        # sentence-transformers 6 names it preprocess (tokenize is its deprecated alias).
        f = model.preprocess(texts) if hasattr(model, "preprocess") else model.tokenize(texts)
        out.append({k: v.to(device) if hasattr(v, "to") else v for k, v in f.items()})
    return out


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(torch, model, loss_fn, batch, device):
    """One forward, backward and AdamW step on `batch` (learning rate 0: the states are made, the weights stay)."""
    cuda = device.type == "cuda"
    params = [p for p in model.parameters() if p.requires_grad]
    for p in model.parameters():
        p.grad = None
    optimizer = torch.optim.AdamW(params, lr=0.0, weight_decay=0.0)
    feats = features(model, batch, device)
    cuda_peak = None
    try:
        for attempt in range(2 if cuda else 1):
            # On CUDA the second step is the steady state (the optimizer's states already held), as in training.
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            with SavedTensors(torch, model) as saved:
                loss = loss_fn(feats, None)
                loss.backward()
            del loss
            optimizer.step()
            if attempt == 0:
                grads = tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)
                no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            optimizer.zero_grad(set_to_none=False)
            if cuda:
                torch.cuda.synchronize()
                cuda_peak = torch.cuda.max_memory_allocated()
    except torch.OutOfMemoryError:
        optimizer.zero_grad(set_to_none=True)
        del optimizer
        torch.cuda.empty_cache()
        return None
    states = tensor_bytes(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    stepped = sum(1 for s in optimizer.state.values() if s)
    optimizer.zero_grad(set_to_none=True)
    del optimizer
    weights = tensor_bytes(model.parameters())
    buffers = tensor_bytes(model.buffers())
    trainable = tensor_bytes(params)
    return {
        "weights": weights,
        "buffers": buffers,
        "trainable": trainable,
        "trainable_parameters": sum(p.numel() for p in params),
        "parameters": sum(p.numel() for p in model.parameters()),
        "gradients": grads,
        "optimizer_states": states,
        "optimizer_tensors_with_state": stepped,
        "activations": saved.peak,
        "peak": weights + buffers + grads + states + saved.peak,
        "cuda_max_memory_allocated": cuda_peak,
        "without_gradient": no_grad,
    }


def largest(m, card, per, margin, reserve=CUDA_RESERVE):
    """The largest batch (or mini-batch) whose estimate fits `card` bytes, less the margin and CUDA's reserve."""
    if m is None or per <= 0:
        return None
    usable = card * (1 - margin) - reserve
    fixed = m["peak"] - m["activations"]
    return max(0, int((usable - fixed) // per))


def memory_report(torch, model, loss_fn, pairs, args, device, auto_model_slot, lora_config):
    """Measure each variant on the longest batch; leave the model as the run trains it."""
    unit = args.mini_batch if args.loss == "cached-mnrl" else args.batch_size
    batch, shape = longest_batch(model, pairs, args.batch_size, model.max_seq_length)
    say(f"measuring one step on the longest batch: {shape['pairs']} pairs, longest texts "
        f"{'/'.join(map(str, shape['longest']))} tokens, {shape['tokens']:,} tokens ({shape['padded_tokens']:,} "
        f"padded), on {device}")
    variants = []

    def each_checkpointing(name, lora):
        for checkpointing in (False, True):
            am = auto_model_slot()
            if checkpointing:
                am.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            m = measure(torch, model, loss_fn, batch, device)
            if checkpointing:
                am.gradient_checkpointing_disable()
            per = m["activations"] / unit if m else 0
            variants.append({
                "variant": name + (" + gradient checkpointing" if checkpointing else ""),
                "lora": lora, "gradient_checkpointing": checkpointing,
                "measured": m,
                "activations_per_pair": per,
                "largest": {str(c): largest(m, c * GIB, per, args.margin) for c in CARDS_GIB},
            })

    model.train()
    each_checkpointing("full fine-tune", False)
    from peft import get_peft_model

    base = auto_model_slot()
    trainable = {name: p.requires_grad for name, p in base.named_parameters()}
    wrapped = get_peft_model(base, copy.deepcopy(lora_config))
    auto_model_slot(wrapped)
    each_checkpointing(f"LoRA r={lora_config.r}", True)
    if args.lora:
        # The run trains these adapters; a fresh set, as the measurement's zero-rate step left them.
        auto_model_slot(wrapped)
    else:
        # The adapters out again, and the weights trainable as they were (peft froze them).
        base = auto_model_slot(wrapped.unload())
        for name, p in base.named_parameters():
            p.requires_grad_(trainable.get(name, True))
    report = {"longest_batch": shape, "unit": "mini-batch" if args.loss == "cached-mnrl" else "batch",
              "unit_size": unit, "measured_on": str(device), "margin": args.margin,
              "cuda_reserve_bytes": CUDA_RESERVE, "variants": variants}
    return report


def print_memory(report, run_variant):
    unit = report["unit"]
    lines = [f"memory of one step on the longest batch ({report['longest_batch']['pairs']} pairs), measured on "
             f"{report['measured_on']}; 'fits' = the largest {unit} whose estimate is within a card's memory less "
             f"{report['margin']:.0%} and {size(report['cuda_reserve_bytes'])} for CUDA itself:",
             f"  {'variant':<38} {'weights':>10} {'gradients':>10} {'optimizer':>10} {'activations':>12} "
             f"{'peak':>10} {'cuda max':>10}  fits 48 / 80 GiB"]
    for v in report["variants"]:
        m = v["measured"]
        mark = "*" if v["variant"] == run_variant else " "
        if m is None:
            lines.append(f" {mark}{v['variant']:<38} out of memory on {report['measured_on']}")
            continue
        fits = " / ".join(f"{v['largest'][str(c)]:,}" for c in CARDS_GIB)
        lines.append(f" {mark}{v['variant']:<38} {size(m['weights']):>10} {size(m['gradients']):>10} "
                     f"{size(m['optimizer_states']):>10} {size(m['activations']):>12} {size(m['peak']):>10} "
                     f"{size(m['cuda_max_memory_allocated']):>10}  {fits}")
    lines.append(f"  (* this run; peak = weights + buffers + gradients + optimizer states + activations; activations "
                 f"grow with the {unit} at this length)")
    for line in lines:
        say(line)


# ---------------------------------------------------------------------------------------------------------------
# Training


def cpu_name():
    """The processor's model name (Linux), else what Python knows of it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_variant_name(args, lora_config):
    name = f"LoRA r={lora_config.r}" if args.lora else "full fine-tune"
    return name + (" + gradient checkpointing" if args.gradient_checkpointing else "")


def available_memory(torch, device, args):
    """(bytes, where): the memory this run must fit."""
    if args.card_gb:
        return int(args.card_gb * GIB), f"a {args.card_gb:g} GiB card (--card-gb)"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.total_memory, f"{props.name} ({size(props.total_memory)})"
    import psutil

    free = psutil.virtual_memory().available
    return free, f"this machine's free memory ({size(free)})"


def adapt(args):
    checkpoint = Path(args.checkpoint).resolve()
    out = Path(args.out).resolve()
    if not (checkpoint / "modules.json").is_file():
        fail(f"{checkpoint}: not a sentence-transformers directory (no modules.json)")
    weights = export_onnx.model_files(checkpoint)
    if not weights:
        fail(f"{checkpoint}: no weights ({' or '.join(export_onnx.WEIGHT_FILES)})")
    if out.exists() and not out.is_dir():
        fail(f"{out} is a file: choose a new directory for the checkpoint")
    if out.is_dir() and any(out.iterdir()):
        fail(f"{out} exists and is not empty: choose a new directory")
    if args.steps is not None and args.steps < 1:
        fail("--steps must be at least 1")
    if args.batch_size < 2:
        fail("--batch-size must be at least 2: the other pairs of a batch are each anchor's negatives")
    if args.loss == "cached-mnrl" and not 1 <= args.mini_batch <= args.batch_size:
        fail("--mini-batch must be between 1 and --batch-size")
    # Everything that can be checked without torch is checked before it loads.
    pairs, data = read_pairs(args)
    say(f"{len(pairs):,} pairs from {data['uri']}"
        + (f" version {data['version']}" if data.get("version") is not None else "")
        + f" (columns {', '.join(data['columns'])}; rows sha256 {data['rows_sha256'][:12]}…)")

    import numpy as np
    import peft
    import sentence_transformers
    import torch
    import transformers
    from peft import LoraConfig, TaskType
    from sentence_transformers import SentenceTransformer
    try:
        from sentence_transformers.sentence_transformer import losses
    except ImportError:
        from sentence_transformers import losses

    transformers.utils.logging.disable_progress_bar()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch sees no CUDA device here")
    started = time.monotonic()
    torch.manual_seed(args.seed)
    model = SentenceTransformer(str(checkpoint), device=str(device), trust_remote_code=args.trust_remote_code,
                                model_kwargs={"dtype": torch.float32})
    # --max-seq-length cuts the training texts; the checkpoint written keeps the base's length, so that base and
    # adapted embed a corpus under the same truncation.
    serving_length = model.max_seq_length
    if args.max_seq_length:
        model.max_seq_length = args.max_seq_length
    transformer = model[0]
    if type(transformer).__name__ != "Transformer":
        fail(f"{checkpoint}: the first module is {type(transformer).__name__}, not a Transformer")

    def auto_model_slot(new=None):
        if new is not None:
            transformer.auto_model = new
        return transformer.auto_model

    targets = args.lora_targets.split(",") if args.lora_targets else None
    lora_config = LoraConfig(task_type=TaskType.FEATURE_EXTRACTION, r=args.lora_r, lora_alpha=args.lora_alpha,
                             lora_dropout=args.lora_dropout, target_modules=targets)
    loss_fn = (losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=args.mini_batch)
               if args.loss == "cached-mnrl" else losses.MultipleNegativesRankingLoss(model))

    # Memory, before the first step.
    try:
        report = memory_report(torch, model, loss_fn, pairs, args, device, auto_model_slot, lora_config)
    except ValueError as e:
        if "target_modules" in str(e) or "Target modules" in str(e):
            fail(f"LoRA does not know this model's layers ({e}); name them with --lora-targets")
        raise
    run_variant = run_variant_name(args, lora_config)
    print_memory(report, run_variant)
    mine = next(v for v in report["variants"] if v["variant"] == run_variant)
    unit = args.mini_batch if args.loss == "cached-mnrl" else args.batch_size
    have, where = available_memory(torch, device, args)
    reserve = CUDA_RESERVE if (device.type == "cuda" or args.card_gb) else 0
    usable = int(have * (1 - args.margin) - reserve)
    m = mine["measured"]
    need = m["peak"] if m else None
    fits = largest(m, have, mine["activations_per_pair"], args.margin, reserve) if m else 0
    report["run"] = {"variant": run_variant, "needs": need, "memory": have, "usable": usable, "where": where,
                     "largest": fits}
    if need is None or need > usable:
        others = [f"{v['variant']}: {largest(v['measured'], have, v['activations_per_pair'], args.margin, reserve):,}"
                  for v in report["variants"] if v["measured"]]
        fail(f"this run ({run_variant}, {report['unit']} {unit}) needs {size(need) if need else 'more than it has'} "
             f"on its longest batch, and {where} leaves {size(usable)} after the {args.margin:.0%} margin"
             + (" and CUDA's reserve" if reserve else "")
             + f"; the largest {report['unit']} that fits: {'; '.join(others)}. Lower --{'mini-batch' if args.loss == 'cached-mnrl' else 'batch-size'}, or add --gradient-checkpointing or --lora")
    say(f"this run ({run_variant}, {report['unit']} {unit}) needs {size(need)} on its longest batch; {where} "
        f"leaves {size(usable)} usable")
    if args.memory_only:
        print(json.dumps(report, indent=2))
        return

    # Training.
    if args.gradient_checkpointing:
        auto_model_slot().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    order = random.Random(args.seed)
    per_epoch = math.ceil(len(pairs) / args.batch_size)
    total = args.steps if args.steps is not None else max(1, math.ceil(args.epochs * per_epoch))
    warmup = int(args.warmup * total)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, warmup, total)

    def batches():
        while True:
            index = list(range(len(pairs)))
            order.shuffle(index)
            for i in range(0, len(index), args.batch_size):
                chunk = index[i:i + args.batch_size]
                if len(chunk) >= 2:
                    yield chunk

    say(f"training {total} steps ({total / per_epoch:.2f} epochs of {per_epoch} batches of {args.batch_size}), "
        f"{args.loss}, lr {args.lr:g} with {warmup} warm-up steps, seed {args.seed}, on {device}")
    model.train()
    losses_per_step = []
    stream = batches()
    train_started = time.monotonic()
    every = max(1, total // 10)
    for step in range(1, total + 1):
        chunk = next(stream)
        texts = [[pairs[i][c] for i in chunk] for c in range(len(pairs[0]))]
        loss = loss_fn(features(model, texts, device), None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses_per_step.append(round(float(loss.item()), 6))
        if step % every == 0 or step == total:
            say(f"step {step}/{total}: loss {losses_per_step[-1]:.4f} ({time.monotonic() - train_started:.1f} s)")
    train_seconds = time.monotonic() - train_started

    if args.gradient_checkpointing:
        auto_model_slot().gradient_checkpointing_disable()
    if args.lora:
        auto_model_slot(auto_model_slot().merge_and_unload())
    model.eval()
    training_length = model.max_seq_length
    model.max_seq_length = serving_length
    tmp = Path(tempfile.mkdtemp(prefix="adapt-", dir=out.parent if out.parent.is_dir() else None))
    try:
        staging = tmp / "checkpoint"
        model.save(str(staging))
        base_name, _, base_rev = (args.base or "").partition("@")
        base_record = checkpoint / RECORD_FILE
        record = {
            "format": RECORD_FORMAT,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "adaptation": "lora-merged" if args.lora else "full",
            "base": {
                "name": base_name or checkpoint.name,
                "revision": base_rev or None,
                "directory": str(checkpoint),
                "weights_sha256": weights,
                "training_record_sha256": export_onnx.sha256_file(base_record) if base_record.is_file() else None,
            },
            "training_data": data,
            "hyperparameters": {
                "loss": {"mnrl": "MultipleNegativesRankingLoss",
                         "cached-mnrl": "CachedMultipleNegativesRankingLoss"}[args.loss],
                "scale": loss_fn.scale,
                "batch_size": args.batch_size,
                "mini_batch_size": args.mini_batch if args.loss == "cached-mnrl" else None,
                "steps": total,
                "epochs": round(total / per_epoch, 4),
                "learning_rate": args.lr,
                "warmup_steps": warmup,
                "schedule": "linear",
                "optimizer": "AdamW",
                "weight_decay": args.weight_decay,
                "max_grad_norm": args.max_grad_norm,
                "max_seq_length": training_length,
                "gradient_checkpointing": args.gradient_checkpointing,
                "lora": {"r": lora_config.r, "alpha": lora_config.lora_alpha, "dropout": lora_config.lora_dropout,
                         "target_modules": sorted(lora_config.target_modules) if lora_config.target_modules else None}
                if args.lora else None,
            },
            "seed": args.seed,
            "loss_per_step": losses_per_step,
            "seconds": {"training": round(train_seconds, 2), "total": round(time.monotonic() - started, 2)},
            "libraries": {"python": platform.python_version(), "torch": torch.__version__,
                          "transformers": transformers.__version__,
                          "sentence_transformers": sentence_transformers.__version__, "peft": peft.__version__},
            "device": {"type": device.type,
                       "name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
                       "threads": torch.get_num_threads()},
            "memory": report,
            "weights_sha256": export_onnx.model_files(staging),
        }
        (staging / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()
        shutil.move(str(staging), str(out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"wrote {out} ({total} steps in {train_seconds:.1f} s, loss {losses_per_step[0]:.4f} → "
        f"{losses_per_step[-1]:.4f}; {RECORD_FILE}); export it with scripts/export-onnx {out} OUT")


def main():
    p = argparse.ArgumentParser(prog="scripts/adapt")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--pairs", required=True, metavar="URI[@VERSION|@TAG]")
    p.add_argument("--anchor")
    p.add_argument("--positive")
    p.add_argument("--negative")
    p.add_argument("--steps", type=int)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--mini-batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--max-seq-length", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss", choices=["mnrl", "cached-mnrl"], default="mnrl")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lora-dropout", type=float, default=0.05)
    p.add_argument("--lora-targets", metavar="a,b")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--card-gb", type=float, metavar="GB")
    p.add_argument("--margin", type=float, default=0.10)
    p.add_argument("--memory-only", action="store_true")
    p.add_argument("--base", metavar="NAME@REVISION")
    p.add_argument("--trust-remote-code", action="store_true")
    args = p.parse_args()
    # ctrl-C or SIGTERM: nothing is written (the checkpoint goes to OUT only once whole). Both handled here, since
    # Python leaves SIGINT alone when it starts ignored (a script's background job), where it would not stop.
    def stop(*_):
        raise KeyboardInterrupt()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        adapt(args)
    except KeyboardInterrupt:
        print("adapt: stopped before its end, as asked; nothing was written", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
