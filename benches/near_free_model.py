"""A near-free stand-in for a model: the model directory's own tokenizer, configs and ONNX inputs and outputs, with
a graph that only gathers one table row per token (Gather on input_ids), so that a run with it costs the pipeline's
host path (read, count, order, tokenise, build inputs, pool, write) and almost no model time.

    python benches/near_free_model.py MODEL_DIR OUT_DIR [--pooled]

With --pooled the stand-in hands back one vector per text (`sentence_embedding`, the table row of each text's first
token) instead of every token's state: what a GPU run's host receives, where the pipeline adds mean pooling to the
graph and the device pools. Without it, the token states cost the CPU as much memory traffic as a real model's
(batch x tokens x dim floats written, then pooled on the host).

Needs the `onnx` package (benches/run.sh installs it into its own environment). The copy has no probe.json: its
vectors are not the model's.
"""
import json
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

src, out = sys.argv[1], sys.argv[2]
pooled = "--pooled" in sys.argv[3:]
shutil.rmtree(out, ignore_errors=True)
shutil.copytree(src, out, ignore=shutil.ignore_patterns("probe.json", "onnx", "lineage.json"))
model = onnx.load(f"{src}/onnx/model.onnx", load_external_data=False)
weights = {i.name for i in model.graph.initializer}
inputs = [i for i in model.graph.input if i.name not in weights]
# The token states output (rank 3), as the pipeline reads it.
states = [o for o in model.graph.output if len(o.type.tensor_type.shape.dim) == 3]
if not states:
    sys.exit(f"{src}/onnx/model.onnx has no token-states output (rank 3) to stand in for")
output = states[0]
config = json.load(open(f"{src}/config.json"))
vocab, dim = config["vocab_size"], config["hidden_size"]
dtype = np.float16 if output.type.tensor_type.elem_type == TensorProto.FLOAT16 else np.float32
table = np.random.default_rng(0).standard_normal((vocab, dim)).astype(dtype)
weights = [numpy_helper.from_array(table, "table")]
if pooled:
    output = helper.make_tensor_value_info("sentence_embedding", output.type.tensor_type.elem_type, ["batch", dim])
    weights.append(numpy_helper.from_array(np.array(0, dtype=np.int64), "first"))
    nodes = [
        helper.make_node("Gather", ["input_ids", "first"], ["first_ids"], axis=1),
        helper.make_node("Gather", ["table", "first_ids"], [output.name], axis=0),
    ]
else:
    nodes = [helper.make_node("Gather", ["table", "input_ids"], [output.name], axis=0)]
graph = helper.make_graph(nodes, "near_free", inputs, [output], weights)
stand_in = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
stand_in.ir_version = 8
onnx.checker.check_model(stand_in)
(__import__("pathlib").Path(out) / "onnx").mkdir(parents=True, exist_ok=True)
onnx.save(stand_in, f"{out}/onnx/model.onnx")
print(f"{out}: Gather of a {vocab} x {dim} table into `{output.name}`, inputs {[i.name for i in inputs]}")
