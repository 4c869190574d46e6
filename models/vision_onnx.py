"""A small ViT-style vision encoder with an MLP projector, written as an ONNX graph from numpy.

No torch: the graph is assembled with `onnx.helper`, so building the demo bundle is light enough to
run on a device. Input `pixel_values` float32 [B, 3, H, W]; output `image_embeds` float32
[B, N, D_lm] where N = (H / patch) * (W / patch). The batch dimension is dynamic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization needs 17; every ONNX Runtime since 1.14 runs it.


@dataclass(frozen=True)
class VisionShape:
    image_size: int = 112
    patch: int = 16
    width: int = 64
    heads: int = 4
    blocks: int = 2
    mlp: int = 128
    out_dim: int = 128  # the language model's embedding width

    @property
    def tokens(self) -> int:
        return (self.image_size // self.patch) ** 2


class _Graph:
    """Collects nodes and initializers; names every intermediate uniquely."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], std: float) -> str:
        return self.const(name, self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def linear(self, x: str, name: str, d_in: int, d_out: int) -> str:
        w = self.weight(f"{name}.weight", (d_in, d_out), d_in**-0.5)
        b = self.const(f"{name}.bias", np.zeros(d_out, np.float32))
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, name: str, dim: int) -> str:
        scale = self.const(f"{name}.weight", np.ones(dim, np.float32))
        bias = self.const(f"{name}.bias", np.zeros(dim, np.float32))
        return self.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-6)

    def gelu(self, x: str) -> str:
        # Exact GELU from Erf: opset 17 has no Gelu op.
        half = self.const(f"c_half_{self._n}", np.array(0.5, np.float32))
        one = self.const(f"c_one_{self._n}", np.array(1.0, np.float32))
        inv_sqrt2 = self.const(f"c_isq2_{self._n}", np.array(2**-0.5, np.float32))
        erf = self.op("Erf", [self.op("Mul", [x, inv_sqrt2])])
        return self.op("Mul", [self.op("Mul", [x, half]), self.op("Add", [erf, one])])


def build_vision_model(shape: VisionShape, seed: int) -> onnx.ModelProto:
    g = _Graph(np.random.default_rng(seed))
    n, d, h = shape.tokens, shape.width, shape.heads
    dh = d // h

    patches = g.op(
        "Conv",
        ["pixel_values", g.weight("patch_embed.weight", (d, 3, shape.patch, shape.patch), 0.02),
         g.const("patch_embed.bias", np.zeros(d, np.float32))],
        kernel_shape=[shape.patch, shape.patch], strides=[shape.patch, shape.patch],
    )
    x = g.op("Reshape", [patches, g.const("shape_bdn", np.array([0, d, n], np.int64))])
    x = g.op("Transpose", [x], perm=[0, 2, 1])
    x = g.op("Add", [x, g.weight("pos_embed", (1, n, d), 0.02)])

    heads_shape = g.const("shape_bnhd", np.array([0, n, h, dh], np.int64))
    merge_shape = g.const("shape_bnd", np.array([0, n, d], np.int64))
    scale = g.const("attn_scale", np.array(dh**-0.5, np.float32))
    for i in range(shape.blocks):
        p = f"blocks.{i}"
        y = g.layer_norm(x, f"{p}.norm1", d)
        q, k, v = (
            g.op("Transpose", [g.op("Reshape", [g.linear(y, f"{p}.attn.{t}", d, d), heads_shape])],
                 perm=[0, 2, 1, 3])
            for t in ("q", "k", "v")
        )
        scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
        attn = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        attn = g.op("Reshape", [g.op("Transpose", [attn], perm=[0, 2, 1, 3]), merge_shape])
        x = g.op("Add", [x, g.linear(attn, f"{p}.attn.proj", d, d)])
        y = g.layer_norm(x, f"{p}.norm2", d)
        y = g.linear(g.gelu(g.linear(y, f"{p}.mlp.fc1", d, shape.mlp)), f"{p}.mlp.fc2", shape.mlp, d)
        x = g.op("Add", [x, y])
    x = g.layer_norm(x, "post_norm", d)

    # Projector (LLaVA-style two-layer MLP) into the language model's embedding space.
    x = g.linear(g.gelu(g.linear(x, "projector.fc1", d, shape.out_dim)), "projector.fc2",
                 shape.out_dim, shape.out_dim)
    g.nodes.append(helper.make_node("Identity", [x], ["image_embeds"]))

    graph = helper.make_graph(
        g.nodes, "edge_demo_vision",
        [helper.make_tensor_value_info(
            "pixel_values", TensorProto.FLOAT, ["batch", 3, shape.image_size, shape.image_size])],
        [helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, ["batch", n, shape.out_dim])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="edge-runtime-demo")
    model.ir_version = 8  # readable by ONNX Runtime 1.14+ (JetPack 5 wheels)
    onnx.checker.check_model(model, full_check=True)
    return model
