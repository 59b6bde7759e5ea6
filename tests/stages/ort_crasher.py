"""A real ONNX Runtime 1.24 crash, generated (no downloaded file), for the crash-recovery tests.

ONNX Runtime's level-4 optimiser ``FuseFp16InitializerToFp32NodeTransformer`` (only at graph optimisation level
``all``) looks for the consumer input of a ``fp16 initializer -> Cast(to fp32)`` node by the Cast *node's* name; when
the node and its output are named differently it indexes past the consumer's inputs and the process dies
(SIGABRT from libstdc++'s bounds assertion in the PyPI build; an access violation elsewhere: microsoft/onnxruntime
#32405, fixed by PR #32407 after 1.24). Constant folding would fold the Cast away first, so the pattern survives to
that optimiser only with ``ConstantFolding`` disabled, which the tests set as the recipe's own option. At level
``layout`` or with that one optimiser disabled, the model runs. Nothing in trtflow knows this cause: the recovery
finds it.
"""

from __future__ import annotations

from pathlib import Path

#: The recipe options under which ONNX Runtime 1.24 crashes on `crasher_model` at the default level.
CRASH_OPTIONS = {"disabled_optimizers": ["ConstantFolding"]}
CULPRIT = "FuseFp16InitializerToFp32NodeTransformer"


def crasher_model(path: Path, fp16_weight: bool = True, features: int = 8, classes: int = 4) -> Path:
    """input 'input' float32 [batch, features] -> 'logits' [batch, classes]: x @ W + b, W stored as fp16 and cast
    by a node named unlike its output (``fp16_weight=False``: the same model in plain fp32, the reference)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((features, classes)).astype(np.float16)
    bias = numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), "bias")
    if fp16_weight:
        nodes = [helper.make_node("Cast", ["weight"], ["weight_fp32"], to=TensorProto.FLOAT, name="cast_weight")]
        initializers = [numpy_helper.from_array(weight, "weight"), bias]
    else:
        nodes = []
        initializers = [numpy_helper.from_array(weight.astype(np.float32), "weight_fp32"), bias]
    nodes += [helper.make_node("MatMul", ["input", "weight_fp32"], ["product"], name="matmul"),
              helper.make_node("Add", ["product", "bias"], ["logits"], name="add")]
    graph = helper.make_graph(nodes, "crasher", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                               ["batch", features])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
