"""The Python route a user would write instead of this tool, for the throughput benchmark.

onnxruntime + the `tokenizers` package on the same model file and thread count; inputs sorted by
character length as sentence-transformers' `encode` does; batches of 32; mean pooling; L2
normalisation; written to Lance with pylance. Prints one JSON line with useful tokens per second over
the whole run (tokenising, inference, pooling and the write).

    python benches/python_route.py CORPUS.jsonl N MODEL_DIR OUT.lance THREADS
"""

import json
import sys
import time

import lance
import numpy as np
import onnxruntime as ort
import pyarrow as pa
from tokenizers import Tokenizer


def main():
    corpus, n, model, out, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    docs = []
    with open(corpus) as f:
        for line in f:
            docs.append(json.loads(line))
            if len(docs) == n:
                break
    started = time.perf_counter()
    tok = Tokenizer.from_file(f"{model}/tokenizer.json")
    tok.enable_truncation(256)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(f"{model}/onnx/model.onnx", opts, providers=["CPUExecutionProvider"])
    order = np.argsort([-len(d["text"]) for d in docs], kind="stable")
    vectors = [None] * len(docs)
    useful = processed = 0
    for start in range(0, len(docs), 32):
        idx = order[start:start + 32]
        enc = tok.encode_batch([docs[i]["text"] for i in idx])
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        useful += int(mask.sum())
        processed += mask.size
        hidden = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        for j, i in enumerate(idx):
            vectors[i] = pooled[j]
    table = pa.table({
        "id": [d["id"] for d in docs],
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(vectors).astype(np.float32)), 384),
    })
    lance.write_dataset(table, out)
    seconds = time.perf_counter() - started
    print(json.dumps({"documents": len(docs), "useful_tokens": useful, "processed_tokens": processed,
                      "seconds": seconds, "useful_tokens_per_second": useful / seconds}))


if __name__ == "__main__":
    main()
