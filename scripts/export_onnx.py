"""Export a sentence-transformers checkpoint to a model directory the pipeline loads, verify it, and write
its lineage. Run by scripts/export-onnx inside the exporter's own environment; see that script for usage.

The ONNX graph is the transformer alone (token states out, dynamic batch and sequence axes); pooling and
normalisation stay in the pipeline, as for every model it runs. Verification embeds a fixed sentence set, plus
up to 1,000 of the user's texts, with sentence-transformers (float32, the checkpoint as trained) and with the
exported file through `pipeline embed` (the pipeline's own tokenising, pooling and normalisation), and fails
below the dtype's minimum cosine.
"""

import argparse
import contextlib
import datetime
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# torch's tracer and transformers warn about things the user cannot act on (Python booleans in the trace,
# deprecations); what matters is whether the export reproduces the checkpoint, which the verification measures.
warnings.filterwarnings("ignore")

PRODUCER = "embedding-pipeline/scripts/export-onnx"
SCHEMA = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/definitions/RunEvent"
# This tool's own facets (OpenLineage custom facets, prefixed embeddingPipeline_).
FACET_SCHEMA = "embedding-pipeline:lineage-facet/1"
OPSET = 17
MIN_COSINE = {"float32": 0.99999, "float16": 0.999}
# Images: the pipeline decodes and resizes with its own libraries (the image and fast_image_resize crates, not
# libjpeg and Pillow), whose pixels may differ by one level here and there: issue 57's mark.
MIN_COSINE_IMAGES = {"float32": 0.9999, "float16": 0.999}
MAX_CHECK_TEXTS = 1000
# Protobuf's limit on one message: a graph with more weights than this keeps them in an external data file.
PROTOBUF_LIMIT = 2_000_000_000
EXTERNAL_DATA = "model.onnx_data"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TRAINING_CONFIG_FILES = ("training_args.bin", "training_args.json", "trainer_state.json", "adapter_config.json",
                         "training.json")
# What scripts/adapt writes beside the checkpoint it trains.
TRAINING_RECORD = "training.json"
# What the pipeline runs of a sentence-transformers model: the transformer (exported); pooling, Dense projections
# and normalisation (read from their module folders by the pipeline).
SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "Dropout")
# The model classes of sentence-transformers other than SentenceTransformer (config_sentence_transformers.json's
# model_type), which make no embeddings the pipeline could compute.
OTHER_MODEL_TYPES = {
    "CrossEncoder": "a CrossEncoder: a reranker, which scores pairs of texts and makes no embeddings",
    "SparseEncoder": "a SparseEncoder: it makes sparse vectors (SPLADE's kind), which the pipeline does not",
    "MultiVectorEncoder": "a MultiVectorEncoder: it makes one vector per token, which the pipeline does not",
}

# The fixed verification set: the sentence-transformers README's three sentences, short and long texts, other
# scripts, and a text past every usual max_seq_length (truncation must agree too).
FIXED_TEXTS = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Ok",
    "Zwei Männer stehen am Herd und kochen.",
    "Le chat dort sur le canapé depuis ce matin.",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "SELECT id, embed(text) FROM docs ORDER BY length(text) DESC;",
    "Numbers 3.14159, 2.71828 and 1.41421 are irrational; 42 is not.",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 80),
    "email: someone@example.com, url: https://example.com/a?b=c#d",
    "    leading and trailing spaces    ",
    "UPPER CASE TEXT WITH PUNCTUATION!!!",
]


def fail(message):
    print(f"export-onnx: error: {message}", file=sys.stderr)
    sys.exit(1)


def say(message):
    print(f"export-onnx: {message}", file=sys.stderr)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def facet(**fields):
    return {"_producer": PRODUCER, "_schemaURL": FACET_SCHEMA, **fields}


def read_texts(path):
    """JSON lines: each line a JSON string or an object with a string "text" field (as `pipeline embed`)."""
    texts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                fail(f"{path} line {n}: expected a JSON string or an object with a \"text\" field (JSON lines)")
            if isinstance(value, dict):
                value = value.get("text")
            if not isinstance(value, str):
                fail(f"{path} line {n}: expected a JSON string or an object with a string \"text\" field")
            texts.append(value)
            if len(texts) == MAX_CHECK_TEXTS:
                break
    return texts


def lance_version(root, wanted):
    """(version, manifest path) of a local Lance dataset: a version number, a tag, or None for the latest."""
    versions = root / "_versions"
    found = {}
    for p in versions.glob("*.manifest"):
        stem = p.stem
        if not stem.isdigit():
            continue
        # Lance's V2 naming writes u64::MAX - version, 20 digits wide; V1 writes the version itself.
        version = (2**64 - 1 - int(stem)) if len(stem) == 20 else int(stem)
        found[version] = p
    if not found:
        fail(f"{root}: no Lance versions under _versions/")
    if wanted is None:
        version = max(found)
    elif wanted.isdigit():
        version = int(wanted)
    else:
        tag = root / "_refs" / "tags" / f"{wanted}.json"
        if not tag.is_file():
            fail(f"{root}: no version or tag '{wanted}' (tags are in _refs/tags/)")
        tag_record = json.loads(tag.read_text())
        if tag_record.get("branch"):
            fail(f"{root}: tag '{wanted}' marks a version of branch '{tag_record['branch']}'; give that version's "
                 "number on the main branch, or a tag of the main branch")
        version = tag_record["version"]
    if version not in found:
        fail(f"{root}: version {version} not found (versions: {sorted(found)[:5]}…{sorted(found)[-1]})")
    return version, found[version]


def split_at(spec):
    """(URI, version or tag) of `URI[@VERSION|@TAG]`; an @ inside a path (a folder named a@b/…) is the URI's."""
    head, sep, tail = spec.rpartition("@")
    return (head, tail) if sep and tail and "/" not in tail else (spec, None)


def training_data(spec):
    """The training-data input: a local Lance dataset pinned to a version (its manifest's sha256), local files
    (each file's sha256), or a URI recorded as given (not checked)."""
    uri, wanted = split_at(spec)
    path = Path(uri)
    data = {"uri": uri, "kind": "remote"}
    if "://" not in uri and (path / "_versions").is_dir():
        version, manifest = lance_version(path, wanted)
        data = {
            "uri": str(path.resolve()),
            "kind": "lance",
            "version": version,
            "tag": wanted if wanted and not wanted.isdigit() else None,
            "manifest_sha256": sha256_file(manifest),
        }
    elif "://" not in uri and path.exists():
        if wanted:
            fail(f"{uri}: @{wanted} applies to Lance datasets; this is a plain file or folder")
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        data = {
            "uri": str(path.resolve()),
            "kind": "files",
            "files": {str(p.relative_to(path) if p != path else p.name): sha256_file(p) for p in files},
        }
    elif "://" not in uri:
        fail(f"--train-data {uri}: not found (give a local path, or a URI such as s3://bucket/data.lance@12)")
    else:
        data["version"] = wanted
        say(f"training data {uri} is remote: recorded as given, its digest is not checked")
    return {
        "namespace": "lance" if data["kind"] == "lance" else ("file" if data["kind"] == "files" else "uri"),
        "name": data["uri"],
        "facets": {
            **({"version": facet(datasetVersion=str(data["version"]))} if data.get("version") is not None else {}),
            "embeddingPipeline_trainingData": facet(role="training_data", **data),
        },
    }


def read_training_record(checkpoint, weights):
    """The training record scripts/adapt wrote beside the checkpoint, or None; the weights must be the ones it
    trained."""
    path = checkpoint / TRAINING_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        record["training_data"]["uri"], record["base"]["weights_sha256"], record["hyperparameters"]["steps"]
    except (ValueError, KeyError, TypeError) as e:
        fail(f"{path}: not a training record scripts/adapt wrote ({e}); remove it, or train again")
    trained = record.get("weights_sha256") or {}
    changed = [f"{name} hashes {weights.get(name)}, training wrote {sha}" for name, sha in trained.items()
               if weights.get(name) != sha]
    if changed:
        fail(f"{checkpoint}: the weights are not the ones its {TRAINING_RECORD} says training wrote "
             f"({'; '.join(changed)}); export the checkpoint as trained, or train again")
    return record


def recorded_training_data(checkpoint, recorded, given):
    """The training-data input for a checkpoint with a training record: the data it names (or --train-data, where
    it moved), which must hash as it did when training read it."""
    if given is None:
        if not Path(recorded["uri"]).exists():
            fail(f"{checkpoint}/{TRAINING_RECORD}: its training data {recorded['uri']} is not here; give "
                 f"--train-data with where it is now (it must hash as recorded)")
        version = recorded.get("version")
        given = training_data(recorded["uri"] + (f"@{version}" if version is not None else ""))
    now = given["facets"]["embeddingPipeline_trainingData"]
    for key in ("kind", "version", "manifest_sha256", "files"):
        if recorded.get(key) != now.get(key):
            fail(f"the training data {now['uri']} is not what {checkpoint.name} was trained on: its {key} is "
                 f"{now.get(key)!r}, {TRAINING_RECORD} recorded {recorded.get(key)!r} (rewritten, or another "
                 f"dataset); export with the data as it was")
    return given


def training_summary(record):
    """What lineage.json says of the training: the hyperparameters that decide it, its loss and its data."""
    h = record["hyperparameters"]
    losses = record.get("loss_per_step") or [None]
    return {
        "loss": h.get("loss"), "steps": h.get("steps"), "batch_size": h.get("batch_size"),
        "learning_rate": h.get("learning_rate"), "lora": h.get("lora"), "seed": record.get("seed"),
        "first_loss": losses[0], "last_loss": losses[-1], "device": (record.get("device") or {}).get("type"),
        "rows": record["training_data"].get("rows"), "rows_sha256": record["training_data"].get("rows_sha256"),
        "torch": (record.get("libraries") or {}).get("torch"),
    }


def model_files(directory):
    return {name: sha256_file(directory / name) for name in WEIGHT_FILES if (directory / name).is_file()}


def read_config(checkpoint, name):
    """A JSON file of the checkpoint, {} when it has none; a broken one stops the export, named."""
    path = checkpoint / name
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        fail(f"{path}: not JSON ({e})")


def check_without_torch(checkpoint):
    """What the pipeline would refuse of the checkpoint and needs no torch to see, said before torch loads (issue
    54: a CrossEncoder and a saved truncate_dim were refused after 8 s of torch, naming a deleted folder).
    Returns modules.json's modules."""
    if not (checkpoint / "modules.json").is_file():
        fail(f"{checkpoint}: not a sentence-transformers directory (no modules.json)")
    st_config = read_config(checkpoint, "config_sentence_transformers.json")
    model_type = st_config.get("model_type", "SentenceTransformer")
    if model_type != "SentenceTransformer":
        what = OTHER_MODEL_TYPES.get(model_type, "not a SentenceTransformer, the one kind the pipeline runs")
        fail(f"{checkpoint}/config_sentence_transformers.json: model_type {model_type!r} says this is {what}; "
             f"export a SentenceTransformer (embedding) model")
    if st_config.get("truncate_dim") is not None:
        n = st_config["truncate_dim"]
        fail(f"{checkpoint}/config_sentence_transformers.json: truncate_dim {n} is not read by the pipeline; remove "
             f"it from the file to export at the full dimension, then SET embed.truncate_dim = {n} in the job")
    task = read_config(checkpoint, "sentence_bert_config.json").get("transformer_task") or "feature-extraction"
    if task != "feature-extraction":
        fail(f"{checkpoint}/sentence_bert_config.json: transformer_task {task!r} is not the one the pipeline runs "
             f"(\"feature-extraction\": the bare model's token states, then the module chain's pooling)")
    modules = json.loads((checkpoint / "modules.json").read_text())
    if image_text_folder(checkpoint, modules) is not None:
        return modules
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    for m, kind in zip(modules, kinds):
        if kind not in SUPPORTED_MODULES:
            fail(f"{checkpoint}/modules.json: module {m.get('type')} is not one the pipeline runs "
                 f"(it runs {', '.join(SUPPORTED_MODULES)})")
    if "Pooling" not in kinds:
        fail(f"{checkpoint}/modules.json: has no Pooling module, so it makes no one vector per text")
    # Remote code kept in another repository ("Alibaba-NLP/new-impl--modeling.NewModel", gte-v1.5's): the export
    # runs offline, so that code must be in the checkpoint's folder (issue 54: a 70-line traceback).
    auto_map = read_config(checkpoint, "config.json").get("auto_map") or {}
    elsewhere = sorted({ref for refs in auto_map.values() for ref in (refs if isinstance(refs, list) else [refs])
                        if isinstance(ref, str) and "--" in ref})
    if elsewhere:
        repos = sorted({ref.partition("--")[0] for ref in elsewhere})
        local = [ref.partition("--")[2] for ref in elsewhere]
        files = sorted({name.split(".")[0] + ".py" for name in local})
        fail(f"{checkpoint}/config.json: auto_map takes the model's code from another repository "
             f"({', '.join(repos)}), and the export runs offline. Copy its code files ({', '.join(files)}, and what "
             f"they import) into the checkpoint's folder, change those auto_map entries to name them there "
             f"({', '.join(local)}), read the code, then export with --trust-remote-code")
    return modules


# What sentence-transformers routes each input of an image-text model (CLIP, SigLIP) to: both towers' pooled and
# projected output, which the export's two graphs end in.
TOWERS = {"text": ("get_text_features", "pooler_output"), "image": ("get_image_features", "pooler_output")}
VISION_FILE = "vision_model.onnx"


def image_text_folder(checkpoint, modules):
    """The folder of an image-text model's one module (sentence-transformers 5.4's Transformer routing text and
    images, or the older CLIPModel module), or None for a text model. A routing other than TOWERS stops the export."""
    if len(modules) != 1:
        return None
    module = modules[0]
    kind = module.get("type", "").rsplit(".", 1)[-1]
    folder = checkpoint / module.get("path", "")
    if kind == "CLIPModel":
        return folder
    if kind != "Transformer":
        return None
    routing = read_config(folder, "sentence_bert_config.json").get("modality_config") or {}
    if "image" not in routing:
        return None
    for modality, (method, output) in TOWERS.items():
        said = routing.get(modality) or {}
        if (said.get("method"), said.get("method_output_name")) != (method, output):
            fail(f"{folder}/sentence_bert_config.json: modality_config routes {modality} to "
                 f"{said.get('method')}.{said.get('method_output_name')}; the pipeline runs {method}.{output}")
    extra = sorted(set(routing) - set(TOWERS))
    if extra:
        fail(f"{folder}/sentence_bert_config.json: modality_config also routes {', '.join(map(str, extra))}; the "
             f"pipeline embeds texts and images one at a time")
    return folder


def check_images(tmp):
    """Images for the verification, written as files (sentence-transformers is given their paths, as the pipeline
    reads them): sizes from 3x3 to 900x700, both orientations, and the modes a corpus holds."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(3)
    made = []
    shapes = [(3, 3, "RGB", "png"), (40, 17, "RGB", "png"), (17, 40, "RGBA", "png"), (64, 64, "L", "png"),
              (900, 700, "RGB", "jpeg"), (120, 333, "RGB", "jpeg"), (50, 50, "P", "gif"), (31, 77, "RGB", "webp"),
              (64, 48, "RGB", "bmp"), (48, 64, "RGB", "tiff")]
    for i, (w, h, mode, fmt) in enumerate(shapes):
        # Smooth gradients with noise: a photograph's kind of pixels, where resizing has something to do.
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / max(w + h - 2, 1)], -1)
        pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels, "RGB")
        if mode == "RGBA":
            image.putalpha(Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)))
        elif mode in ("L", "P"):
            image = image.convert(mode)
        path = tmp / f"check-{i}.{fmt}"
        image.save(path, **({"quality": 90} if fmt == "jpeg" else {}))
        made.append(path)
    return made


def export_towers(torch, onnx, model, staging, dtype):
    """An image-text model's two graphs: onnx/model.onnx (texts: the token ids, and the attention mask where the
    tokenizer makes one, to the text tower's vector, as `sentence_embedding`) and onnx/vision_model.onnx (pixel
    values to the vision tower's vector, as `image_embeds`). Returns the exporter and opset."""
    transformer = model[0]
    inner = transformer.auto_model
    tokenizer = transformer.processor.tokenizer
    names = [n for n in ("input_ids", "attention_mask") if n in tokenizer.model_input_names]

    def pooled(out):
        return out.pooler_output if hasattr(out, "pooler_output") else out

    class TextTower(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *inputs):
            return pooled(self.inner.get_text_features(**dict(zip(names, inputs))))

    class VisionTower(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            return pooled(self.inner.get_image_features(pixel_values=pixel_values))

    onnx_dir = staging / "onnx"
    dummy = tokenizer(["a short text", "a somewhat longer text to pad against"], padding=True, return_tensors="pt")
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["sentence_embedding"] = {0: "batch"}
    images = transformer.processor.image_processor
    size = images.crop_size if getattr(images, "do_center_crop", False) else images.size
    pixels = torch.rand(2, 3, size["height"], size["width"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(TextTower().eval(), tuple(dummy[n] for n in names), str(onnx_dir / "model.onnx"),
                          dynamo=False, input_names=names, output_names=["sentence_embedding"], dynamic_axes=axes,
                          opset_version=OPSET)
        torch.onnx.export(VisionTower().eval(), (pixels,), str(onnx_dir / VISION_FILE), dynamo=False,
                          input_names=["pixel_values"], output_names=["image_embeds"],
                          dynamic_axes={"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}},
                          opset_version=OPSET)
    for name in ("model.onnx", VISION_FILE):
        path = onnx_dir / name
        if dtype == "float16":
            onnx.save(to_float16(onnx, path), str(path))
        onnx.checker.check_model(str(path))
    return "torchscript", OPSET


def verify_towers(np, model, staging, args, tmp):
    """Both towers of the export against sentence-transformers' encode: the fixed texts (and --check-texts) through
    `pipeline embed`, and the check images, given to both as file paths, through `pipeline embed --image`."""
    texts = FIXED_TEXTS + (read_texts(args.check_texts) if args.check_texts else [])
    images = check_images(tmp)
    texts_file = tmp / "texts.jsonl"
    texts_file.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
    runs = {
        "texts": ([args.pipeline, "embed", "--model", str(staging), "--file", str(texts_file)], texts),
        "images": ([args.pipeline, "embed", "--model", str(staging)]
                   + [a for p in images for a in ("--image", str(p))], [str(p) for p in images]),
    }
    worst = (2.0, "")
    result = {}
    for kind, (command, inputs) in runs.items():
        reference = model.encode(inputs, batch_size=32, convert_to_numpy=True).astype(np.float64)
        try:
            run = subprocess.run(command, capture_output=True, text=True)
        except OSError as e:
            fail(f"cannot run pipeline ({args.pipeline}): {e}")
        if run.returncode != 0:
            fail(f"pipeline embed failed on the export's {kind} of {args.checkpoint}:\n{run.stderr.strip()}")
        ours = np.array([json.loads(line)["vector"] for line in run.stdout.splitlines()], dtype=np.float64)
        if ours.shape != reference.shape:
            fail(f"pipeline embed gave {ours.shape} vectors for the {kind}, sentence-transformers {reference.shape}")
        cos = (ours * reference).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1))
        result[kind] = {"count": len(inputs), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
                        "max_abs_diff": float(np.abs(ours - reference).max())}
        if cos.min() < worst[0]:
            worst = (float(cos.min()), Path(inputs[int(cos.argmin())]).name if kind == "images"
                     else inputs[int(cos.argmin())][:80])
        say(f"verified on {len(inputs)} {kind}: minimum cosine {cos.min():.7f}, mean {cos.mean():.7f}")
    return {
        "texts": len(texts),
        "fixed_texts": len(FIXED_TEXTS),
        "images": len(images),
        "check_texts_file": str(Path(args.check_texts).resolve()) if args.check_texts else None,
        "reference": "sentence-transformers, float32, CPU; images given as file paths",
        "candidate": "pipeline embed and pipeline embed --image (ONNX Runtime, the pipeline's image processing), CPU",
        "min_cosine": worst[0],
        "towers": result,
        "threshold_min_cosine": MIN_COSINE_IMAGES[args.dtype],
        "worst_text": worst[1],
        "passed": worst[0] >= MIN_COSINE_IMAGES[args.dtype],
    }


def export(args):
    checkpoint = Path(args.checkpoint).resolve()
    out = Path(args.out).resolve()
    modules = check_without_torch(checkpoint)
    # An image-text model's weights are in its one module's folder (0_CLIPModel/ in the older layout).
    weights = model_files(image_text_folder(checkpoint, modules) or checkpoint)
    if not weights:
        fail(f"{checkpoint}: no weights ({' or '.join(WEIGHT_FILES)})")
    if out.exists() and any(out.iterdir()):
        fail(f"{out} exists and is not empty: choose a new directory")
    # Everything that can be checked without torch is checked before it loads.
    training = read_training_record(checkpoint, weights)
    train_data = training_data(args.train_data) if args.train_data else None
    if training:
        train_data = recorded_training_data(checkpoint, training["training_data"], train_data)

    import numpy as np
    import onnx
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.utils.logging.disable_progress_bar()

    started = time.monotonic()
    torch.manual_seed(0)
    try:
        # In float32 whatever the checkpoint's own dtype: transformers 5 loads a checkpoint saved in bfloat16
        # (Qwen3-Embedding's, gte-Qwen2's) as bfloat16, whose trace failed ("ScalarType ComplexDouble is an
        # unexpected tensor scalar type"), and the reference would not be float32.
        model = SentenceTransformer(str(checkpoint), device="cpu", trust_remote_code=args.trust_remote_code,
                                    model_kwargs={"dtype": torch.float32})
    except ValueError as e:
        if "trust_remote_code" not in str(e) or args.trust_remote_code:
            raise
        fail(f"{checkpoint}: the checkpoint's model is its own code (custom modelling files); read them, then "
             f"export with --trust-remote-code to run them")
    model.eval()
    transformer = model[0]
    image_folder = image_text_folder(checkpoint, modules)
    tmp = Path(tempfile.mkdtemp(prefix="export-onnx-"))
    try:
        staging = tmp / "model"
        staging.mkdir()
        copy_configs(checkpoint, staging, modules, with_weights=image_folder is None)
        (staging / "onnx").mkdir()
        onnx_path = staging / "onnx" / "model.onnx"
        if image_folder is not None:
            exporter, opset = export_towers(torch, onnx, model, staging, args.dtype)
            export_seconds = time.monotonic() - started
            say(f"exported {args.dtype} ONNX (text and vision towers) in {export_seconds:.1f} s")
            verification = verify_towers(np, model, staging, args, tmp)
            verification["seconds"] = round(time.monotonic() - started - export_seconds, 2)
            if not verification["passed"]:
                fail(f"the export does not reproduce sentence-transformers: minimum cosine "
                     f"{verification['min_cosine']:.7f} < {verification['threshold_min_cosine']}, worst on "
                     f"{verification['worst_text']!r}; nothing written to {out}")
        else:
            auto_model = transformer.auto_model
            tokenizer = transformer.tokenizer
            input_names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]

            class TokenStates(torch.nn.Module):
                """The transformer with the token states as its one output."""

                def __init__(self, inner):
                    super().__init__()
                    self.inner = inner

                def forward(self, *inputs):
                    out = self.inner(**dict(zip(input_names, inputs)))
                    return out.last_hidden_state

            exported = TokenStates(auto_model).eval()
            dummy = tokenizer(["a short text", "a somewhat longer text to pad against"], padding=True, return_tensors="pt")
            axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
            axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
            exporter, opset = trace(torch, onnx, exported, tuple(dummy[n] for n in input_names), onnx_path, input_names, axes,
                  model_type=getattr(auto_model.config, "model_type", "?"))
            graph = None
            if args.dtype == "float16":
                graph = to_float16(onnx, onnx_path)
            # Above 2 GB (protobuf's limit) torch writes each weight to a file of its own beside the graph; those, or
            # every weight under --external-data, go into one file, onnx/model.onnx_data, which the pipeline's
            # fingerprint hashes with the graph.
            loose = [p for p in onnx_path.parent.iterdir() if p != onnx_path]
            if args.external_data or loose or (graph is not None and weight_bytes(graph) > PROTOBUF_LIMIT):
                graph = graph if graph is not None else onnx.load(str(onnx_path))
                for p in loose:
                    p.unlink()
                onnx.save_model(graph, str(onnx_path), save_as_external_data=True, all_tensors_to_one_file=True,
                                location=EXTERNAL_DATA, size_threshold=0)
                # onnx creates the data file readable by its owner alone (0600): a model directory copied into an
                # image or shared with a service user would then fail to load. Readable as the graph beside it is.
                os.chmod(onnx_path.parent / EXTERNAL_DATA, onnx_path.stat().st_mode & 0o777)
                say(f"the weights are in onnx/{EXTERNAL_DATA} ({(onnx_path.parent / EXTERNAL_DATA).stat().st_size:,} bytes)")
            elif graph is not None:
                onnx.save(graph, str(onnx_path))
            onnx.checker.check_model(str(onnx_path))
            export_seconds = time.monotonic() - started
            say(f"exported {args.dtype} ONNX in {export_seconds:.1f} s")

            texts = FIXED_TEXTS + (read_texts(args.check_texts) if args.check_texts else [])
            # The checkpoint's default prompt on both sides, if it has one: the pipeline applies it as
            # sentence-transformers' encode() does (config_sentence_transformers.json travels with the export).
            reference = model.encode(texts, batch_size=32, convert_to_numpy=True)
            prompts = getattr(model, "prompts", None) or {}
            default_name = getattr(model, "default_prompt_name", None) or ""
            if prompts.get(default_name, ""):
                say(f"the checkpoint's default prompt {default_name!r} ({prompts[default_name]!r}) goes before every "
                    f"input, in the pipeline as in sentence-transformers; SET embed.prompt_name = 'none' to leave it "
                    f"out, or name another of its prompts")
            texts_file = tmp / "texts.jsonl"
            texts_file.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
            try:
                run = subprocess.run([args.pipeline, "embed", "--model", str(staging), "--file", str(texts_file)],
                                     capture_output=True, text=True)
            except OSError as e:
                fail(f"cannot run pipeline ({args.pipeline}): {e}")
            if run.returncode != 0:
                # The export's files are the checkpoint's (its configs, copied): name the user's folder, not this one.
                said = run.stderr.strip().replace(str(staging), str(checkpoint))
                fail(f"pipeline embed failed on the export of {checkpoint}:\n{said}")
            ours = np.array([json.loads(line)["vector"] for line in run.stdout.splitlines()], dtype=np.float64)
            ref = reference.astype(np.float64)
            if ours.shape != ref.shape:
                fail(f"pipeline embed gave {ours.shape} vectors, sentence-transformers {ref.shape}")
            cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
            worst = int(cos.argmin())
            verification = {
                "texts": len(texts),
                "fixed_texts": len(FIXED_TEXTS),
                "check_texts_file": str(Path(args.check_texts).resolve()) if args.check_texts else None,
                "reference": "sentence-transformers, float32, CPU",
                "candidate": "pipeline embed (ONNX Runtime, the pipeline's pooling), CPU",
                "min_cosine": float(cos.min()),
                "mean_cosine": float(cos.mean()),
                "max_abs_diff": float(np.abs(ours - ref).max()),
                "threshold_min_cosine": MIN_COSINE[args.dtype],
                "worst_text": texts[worst][:80],
                "passed": bool(cos.min() >= MIN_COSINE[args.dtype]),
                "seconds": round(time.monotonic() - started - export_seconds, 2),
            }
            say(f"verified on {len(texts)} texts: minimum cosine {cos.min():.7f}, mean {cos.mean():.7f}, "
                f"largest element difference {verification['max_abs_diff']:.2e} "
                f"(pass mark {MIN_COSINE[args.dtype]} for {args.dtype})")
            if not verification["passed"]:
                fail(f"the export does not reproduce sentence-transformers: minimum cosine {cos.min():.7f} < "
                     f"{MIN_COSINE[args.dtype]}, worst on {texts[worst][:60]!r}; nothing written to {out}")

        onnx_sha = sha256_file(onnx_path)
        external = {EXTERNAL_DATA: sha256_file(onnx_path.parent / EXTERNAL_DATA)} \
            if (onnx_path.parent / EXTERNAL_DATA).is_file() else None
        vision = {"vision_file": f"onnx/{VISION_FILE}", "vision_sha256": sha256_file(onnx_path.parent / VISION_FILE)} \
            if image_folder is not None else {}
        base_name, _, base_rev = (args.base or "").partition("@")
        adaptation = args.adaptation or (training["adaptation"] if training else ("full" if args.base else "none"))
        training_config = {n: sha256_file(checkpoint / n) for n in TRAINING_CONFIG_FILES if (checkpoint / n).is_file()}
        inputs = []
        if args.base:
            base_files = model_files(Path(args.base_dir)) if args.base_dir else (weights if adaptation == "none" else {})
            inputs.append({
                "namespace": "model",
                "name": base_name,
                "facets": {"embeddingPipeline_model": facet(
                    role="base", revision=base_rev or None, weights_sha256=base_files,
                    directory=str(Path(args.base_dir).resolve()) if args.base_dir else None)},
            })
        elif training:
            base = training["base"]
            inputs.append({
                "namespace": "model",
                "name": base["name"],
                "facets": {"embeddingPipeline_model": facet(
                    role="base", revision=base.get("revision"), weights_sha256=base["weights_sha256"],
                    directory=base["directory"])},
            })
        inputs.append({
            "namespace": "file",
            "name": str(checkpoint),
            "facets": {"embeddingPipeline_model": facet(
                role="checkpoint", adaptation=adaptation, weights_sha256=weights,
                training_config_sha256=training_config,
                **({"training": training_summary(training)} if training else {}))},
        })
        if train_data:
            inputs.append(train_data)
        record = {
            "eventType": "COMPLETE",
            "eventTime": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "producer": PRODUCER,
            "schemaURL": SCHEMA,
            "job": {"namespace": "embedding-pipeline", "name": "export-onnx"},
            "run": {
                "runId": str(uuid.uuid4()),
                "facets": {
                    "embeddingPipeline_exporter": facet(
                        torch=torch.__version__, transformers=transformers.__version__,
                        sentence_transformers=sentence_transformers.__version__, onnx=onnx.__version__,
                        opset=opset, exporter=exporter, dtype=args.dtype, seconds=round(export_seconds, 2)),
                    "embeddingPipeline_verification": facet(**verification),
                },
            },
            "inputs": inputs,
            "outputs": [{
                "namespace": "file",
                "name": str(out),
                "facets": {"embeddingPipeline_onnx": facet(file="onnx/model.onnx", sha256=onnx_sha, external_data_sha256=external, dtype=args.dtype,
                                                           opset=opset, **vision)},
            }],
        }
        (staging / "lineage.json").write_text(json.dumps(record, indent=2) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()
        shutil.move(str(staging), str(out))
        say(f"wrote {out} (onnx/model.onnx sha256 {onnx_sha[:12]}…, lineage.json)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def first_line(error):
    """An exception as one line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def trace(torch, onnx, exported, inputs, onnx_path, input_names, axes, model_type):
    """Export `exported` to `onnx_path` with torch's TorchScript tracer, and where that fails (EmbeddingGemma's
    bidirectional mask under it: issue 54), with torch's dynamo exporter; the verification that follows guards
    either. When both fail, one line names the model type and both errors, never a traceback. Returns which
    exporter wrote the graph ("torchscript" or "dynamo") and its opset."""
    common = dict(input_names=input_names, output_names=["last_hidden_state"])
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(exported, inputs, str(onnx_path), dynamo=False, dynamic_axes=axes,
                              opset_version=OPSET, **common)
        return "torchscript", OPSET
    except Exception as e:  # noqa: BLE001 - any failure of the tracer is answered by the other exporter
        traced = first_line(e)
    for p in onnx_path.parent.iterdir():
        p.unlink()
    say(f"torch's tracer could not export this {model_type} model ({traced}); trying torch's dynamo exporter")
    # Its progress lines and log warnings (torchvision's missing operators) are not the user's business.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            # Weights past protobuf's limit go to a data file, which the export then gathers into model.onnx_data.
            large = sum(p.numel() * p.element_size() for p in exported.parameters()) > PROTOBUF_LIMIT
            # The tracer's dynamic_axes, as dynamo takes them: the wrapper's one varargs parameter, each input
            # dynamic in its batch and sequence.
            # Its own opset: asked for the tracer's older one, its converter failed on these graphs.
            dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}
            torch.onnx.export(exported, inputs, str(onnx_path), dynamo=True, external_data=large,
                              dynamic_shapes=(tuple(dims for _ in inputs),), **common)
    except Exception as e:  # noqa: BLE001
        fail(f"torch cannot export this {model_type} model: the tracer stopped with {traced}, the dynamo exporter "
             f"with {first_line(e)}. Try another torch or transformers version in scripts/export-requirements.txt, "
             f"or report the model type")
    graph = onnx.load(str(onnx_path), load_external_data=False)
    return "dynamo", max((o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")), default=0)


def weight_bytes(model):
    """The bytes of a graph's weights held in the graph itself."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def copy_configs(checkpoint, out, modules, with_weights=True):
    """Everything of the checkpoint but the transformer's weights: tokenizer, configs, the modules' folders (a
    Dense module's folder with its weights, which the pipeline applies; an image-text model's folder without)."""
    skip = set(WEIGHT_FILES) | set(TRAINING_CONFIG_FILES) | {"onnx", "openvino", "lineage.json"}
    module_dirs = {m.get("path", "").strip("/") for m in modules} - {""}
    for p in checkpoint.iterdir():
        if p.name in skip or p.name.startswith(".") or p.suffix in (".pt", ".ckpt", ".h5", ".msgpack"):
            continue
        if p.is_dir() and p.name in module_dirs and with_weights:
            shutil.copytree(p, out / p.name)
        elif p.is_dir():
            shutil.copytree(p, out / p.name, ignore=shutil.ignore_patterns(*WEIGHT_FILES))
        else:
            shutil.copy2(p, out / p.name)


def to_float16(onnx, onnx_path):
    """The float32 trace at `onnx_path` in float16, with float32 inputs and outputs kept.

    Traced in float32, then converted by onnxconverter-common: torch's float16 trace on the CPU leaves
    LayerNormalization with mixed float/float16 types. Two things the converter gets wrong on its own:
    - its shape inference serialises the whole model in memory, which protobuf refuses above 2 GB (a 1.5B
      decoder's float32 trace failed so), so shape inference runs on the file, as ONNX allows at any size;
    - an RMSNorm (Qwen, Llama, Gemma) casts its input to float32 to sum the squares, and the rotary embedding
      computes its angles in float32; the converter turned such a Cast's output type to float16 and left the
      Cast's own type float32, a graph ONNX Runtime refuses. The nodes of a module that casts to float32 stay in
      float32, as torch's autocast keeps them: squares of decoder activations overflow float16's 65,504.
    """
    from onnxconverter_common import float16

    inferred = onnx_path.parent / "inferred.onnx"
    try:
        onnx.shape_inference.infer_shapes_path(str(onnx_path), str(inferred))
        model = onnx.load(str(inferred))
    finally:
        inferred.unlink(missing_ok=True)
    def to_float(n):
        return n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in n.attribute)

    # The modules (a norm, the rotary embedding) that cast to float32 on purpose, by their node's scope.
    upcast_scopes = {n.name.rsplit("/", 1)[0] for n in model.graph.node if to_float(n) and "/" in n.name.strip("/")}
    keep = {n.name for n in model.graph.node if n.name.rsplit("/", 1)[0] in upcast_scopes}
    # The norms' weights reach them through torch's Identity nodes (a weight used twice): those stay too.
    kept_inputs = {i for n in model.graph.node if n.name in keep for i in n.input}
    keep |= {n.name for n in model.graph.node if n.op_type == "Identity" and set(n.output) & kept_inputs}
    model = float16.convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=True,
                                             node_block_list=sorted(keep))
    # Any other cast to float32 (outside a module: a mask's) whose output the converter made float16 casts to
    # float16, as its output now says.
    half = {v.name for v in model.graph.value_info if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    for n in model.graph.node:
        if to_float(n) and n.name not in keep and n.output[0] in half:
            for a in n.attribute:
                if a.name == "to":
                    a.i = onnx.TensorProto.FLOAT16
    return model


def main():
    p = argparse.ArgumentParser(prog="scripts/export-onnx")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--train-data", metavar="URI[@VERSION|@TAG]")
    p.add_argument("--base", metavar="NAME@REVISION")
    p.add_argument("--base-dir", metavar="DIR", help="a local copy of the base model, to hash its weights")
    p.add_argument("--adaptation", choices=["none", "full", "lora-merged"])
    p.add_argument("--check-texts", metavar="FILE")
    p.add_argument("--external-data", action="store_true",
                   help="keep the weights in onnx/model.onnx_data beside the graph (automatic above 2 GB)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the checkpoint's own modelling code (nomic, jina and other custom-code models)")
    p.add_argument("--pipeline", required=True)
    export(p.parse_args())


if __name__ == "__main__":
    main()
