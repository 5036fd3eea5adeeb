"""Camera-sized JPEG photographs for the images benchmark, made from numpy (no downloads).

    python benches/make_photos.py OUT_FOLDER N

Sizes cycle through 640x480, 1280x960, 1920x1080, 3024x4032 (a phone's, upright) and 4000x3000; smooth gradients
with noise, quality 90. Prints the total megapixels.
"""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

out, n = Path(sys.argv[1]), int(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(9)
sizes = [(640, 480), (1280, 960), (1920, 1080), (3024, 4032), (4000, 3000)]
pixels = 0
for i in range(n):
    w, h = sizes[i % len(sizes)]
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x * 255 / (w - 1), y * 255 / (h - 1), (x + y) * 127 / (w + h - 2)], -1)
    photo = np.clip(base + rng.normal(0, 12, (h, w, 3)).astype(np.float32), 0, 255).astype(np.uint8)
    Image.fromarray(photo).save(out / f"photo-{i:04d}.jpg", quality=90)
    pixels += w * h
print(f"{pixels / 1e6:.1f}")
