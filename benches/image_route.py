"""The Python route a user would write instead of this tool for images, for the images benchmark.

Pillow opens each file (EXIF orientation applied, then RGB, as transformers' `load_image` does), transformers'
own CLIPImageProcessor (its PIL backend: no torchvision here) prepares a batch of 32, and onnxruntime runs the
export's vision graph on the same thread count. Prints one JSON line: images and seconds (the whole loop).

    python benches/image_route.py MODEL_DIR IMAGES_FOLDER THREADS
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageOps
from transformers import AutoImageProcessor


def main():
    model, folder, threads = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    processor = AutoImageProcessor.from_pretrained(str(model))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model / "onnx" / "vision_model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    started = time.perf_counter()
    vectors = []
    for i in range(0, len(paths), 32):
        images = [ImageOps.exif_transpose(Image.open(p)).convert("RGB") for p in paths[i:i + 32]]
        pixels = processor(images=images, return_tensors="np")["pixel_values"]
        vectors.append(session.run(["image_embeds"], {"pixel_values": pixels})[0])
    seconds = time.perf_counter() - started
    print(json.dumps({"images": int(np.concatenate(vectors).shape[0]), "seconds": seconds,
                      "processor": type(processor).__name__}))


if __name__ == "__main__":
    main()
