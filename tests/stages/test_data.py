"""The shared model-input data module: specs from ONNX, data sources, loading and checking arrays."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from trtflow.stage import StageFailed
from trtflow_stages.data import (
    DataSource,
    InputSpec,
    batch_rows,
    check_arrays,
    data_files,
    iter_batches,
    load_arrays,
    onnx_input_specs,
    open_dataset,
)
from trtflow_stages.precision.modelopt import check_node_patterns, check_op_types, private_model_copy


def two_input_model(path: Path, image_shape=(1, 3, 4, 4), mask_shape=("batch", 4)) -> Path:
    """image float32 (static batch 1) + mask int64 (dynamic batch); one weight also listed as an input."""
    weight = numpy_helper.from_array(np.ones((4,), dtype=np.float32), name="weight")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["image", "weight"], ["scaled"], name="scale"),
            helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT, name="cast_mask"),
            helper.make_node("ReduceSum", ["scaled"], ["total"], keepdims=0, name="sum"),
        ],
        "two_inputs",
        [
            helper.make_tensor_value_info("image", TensorProto.FLOAT, list(image_shape)),
            helper.make_tensor_value_info("mask", TensorProto.INT64, list(mask_shape)),
            helper.make_tensor_value_info("weight", TensorProto.FLOAT, [4]),
        ],
        [
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("mask_f", TensorProto.FLOAT, list(mask_shape)),
        ],
        initializer=[weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def two_input(tmp_path) -> Path:
    return two_input_model(tmp_path / "two.onnx")


MLP_SPECS = [InputSpec("input", "float32", ("batch", 16))]


def resolver(base: Path):
    return lambda p: (base / p).resolve()


# --- specs -------------------------------------------------------------------------------------------------


def test_specs_of_exported_models(tiny_mlp_onnx, tiny_transformer_onnx):
    assert onnx_input_specs(tiny_mlp_onnx) == MLP_SPECS
    assert onnx_input_specs(tiny_transformer_onnx) == [InputSpec("input_ids", "int64", ("batch", "seq"))]


def test_specs_skip_initializers_and_keep_static_dims(two_input):
    specs = onnx_input_specs(two_input)
    assert [s.name for s in specs] == ["image", "mask"]
    assert specs[0] == InputSpec("image", "float32", (1, 3, 4, 4))
    assert specs[1].dtype == "int64" and specs[1].shape == ("batch", 4) and specs[1].is_dynamic


def test_specs_of_a_broken_file_fail_clearly(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(StageFailed, match="cannot read ONNX model"):
        onnx_input_specs(bad)


# --- the DataSource model -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, got", [({}, "none of them"), ({"path": "a.npz", "callable": "python:m:f"},
                                                                 "path and callable")])
def test_data_source_needs_exactly_one(fields, got):
    with pytest.raises(ValidationError, match=f"exactly one of 'path', 'callable' or 'random'; got {got}"):
        DataSource(**fields)


@pytest.mark.parametrize("ref", ["nocolon", "python:dir/file.txt:f", "python:file.py", "mod:1bad", "a b:f",
                                 "os:system"])
def test_bad_callable_references_are_rejected(ref):
    with pytest.raises(ValidationError, match="expected"):
        DataSource(callable=ref)


def test_random_params_are_validated():
    with pytest.raises(ValidationError, match="low must be smaller"):
        DataSource(random={"num_samples": 1, "ranges": {"x": [1, 1]}})
    with pytest.raises(ValidationError, match=">= 1"):
        DataSource(random={"num_samples": 1, "shapes": {"x": [0, 3]}})
    with pytest.raises(ValidationError):
        DataSource(random={"num_samples": 0})


def test_flags_and_data_files():
    random = DataSource(random={"num_samples": 2})
    assert random.is_random and random.uncalibrated and random.kind == "random"
    assert not DataSource(path="d.npz").uncalibrated
    assert data_files(None) == [] and data_files(random) == []
    assert data_files(DataSource(path="data/calib")) == ["data/calib"]
    assert data_files(DataSource(callable="python:tools/data.py:make")) == ["tools/data.py"]
    assert data_files(DataSource(callable="python:mypkg_not_installed.data:make")) == []


# --- loading ------------------------------------------------------------------------------------------------


def test_npz_file(tmp_path):
    x = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", input=x)
    arrays = load_arrays(DataSource(path="calib.npz"), MLP_SPECS, resolver(tmp_path))
    np.testing.assert_array_equal(arrays["input"], x)


def test_npy_file_for_a_single_input_model(tmp_path):
    x = np.zeros((3, 16), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    arrays = load_arrays(DataSource(path="x.npy"), MLP_SPECS, resolver(tmp_path))
    assert list(arrays) == ["input"] and arrays["input"].shape == (3, 16)


def test_npy_file_for_a_multi_input_model_names_the_inputs(tmp_path, two_input):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 4, 4), dtype=np.float32))
    with pytest.raises(StageFailed, match=r"2 inputs \['image', 'mask'\]") as caught:
        load_arrays(DataSource(path="x.npy"), onnx_input_specs(two_input), resolver(tmp_path))
    assert "np.savez(path, image=..., mask=...)" in caught.value.hint


def test_pickled_arrays_are_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(StageFailed, match="cannot read data file"):
        load_arrays(DataSource(path="x.npy"), MLP_SPECS, resolver(tmp_path))


def test_directory_is_read_sorted_and_concatenated(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    for index in (2, 0, 1):
        np.savez(folder / f"part{index}.npz", input=np.full((2, 16), index, dtype=np.float32))
    (folder / "README.txt").write_text("ignored")
    arrays = load_arrays(DataSource(path="calib"), MLP_SPECS, resolver(tmp_path))
    assert arrays["input"][:, 0].tolist() == [0, 0, 1, 1, 2, 2]


def test_directory_parts_must_hold_the_same_inputs(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    np.savez(folder / "a.npz", input=np.zeros((1, 16), np.float32))
    np.savez(folder / "b.npz", other=np.zeros((1, 16), np.float32))
    with pytest.raises(StageFailed, match=r"b.npz holds arrays \['other'\]"):
        load_arrays(DataSource(path="calib"), MLP_SPECS, resolver(tmp_path))


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(StageFailed, match=r"data file nope\.npz not found"):
        load_arrays(DataSource(path="nope.npz"), MLP_SPECS, resolver(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StageFailed, match=r"holds no \.npz or \.npy file"):
        load_arrays(DataSource(path="empty"), MLP_SPECS, resolver(tmp_path))


def test_python_file_callable_returning_a_list(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "data.py").write_text(textwrap.dedent("""
        import numpy as np

        def samples():
            return [{"input": np.full((2, 16), i, dtype=np.float32)} for i in range(3)]
    """))
    arrays = load_arrays(DataSource(callable="python:tools/data.py:samples"), MLP_SPECS, resolver(tmp_path))
    assert arrays["input"].shape == (6, 16) and arrays["input"][-1, 0] == 2


def test_module_callable_returning_a_dict(tmp_path, monkeypatch):
    (tmp_path / "calibmod_for_test.py").write_text(
        "import numpy as np\n\ndef make():\n    return {'input': np.ones((4, 16), dtype=np.float32)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    arrays = load_arrays(DataSource(callable="python:calibmod_for_test:make"), MLP_SPECS, resolver(tmp_path))
    assert arrays["input"].shape == (4, 16)


def test_callable_errors_are_reported(tmp_path, monkeypatch):
    (tmp_path / "d.py").write_text("def boom():\n    raise RuntimeError('no disk')\n\ndef text():\n    return 'x'\n")
    with pytest.raises(StageFailed, match="raised RuntimeError: no disk"):
        load_arrays(DataSource(callable="python:d.py:boom"), MLP_SPECS, resolver(tmp_path))
    with pytest.raises(StageFailed, match="returned str"):
        load_arrays(DataSource(callable="python:d.py:text"), MLP_SPECS, resolver(tmp_path))
    with pytest.raises(StageFailed, match="has no function 'absent'"):
        load_arrays(DataSource(callable="python:d.py:absent"), MLP_SPECS, resolver(tmp_path))
    with pytest.raises(StageFailed, match="cannot import module"):
        load_arrays(DataSource(callable="python:no_such_module_xyz:f"), MLP_SPECS, resolver(tmp_path))


def test_random_data_follows_specs_ranges_and_seed(two_input, caplog):
    specs = onnx_input_specs(two_input)
    source = DataSource(random={"num_samples": 5, "seed": 3, "ranges": {"mask": [0, 2]}})
    with caplog.at_level("INFO"):
        arrays = load_arrays(source, specs, Path)
    assert arrays["image"].shape == (5, 3, 4, 4) and arrays["image"].dtype == np.float32
    assert arrays["image"].min() >= -1 and arrays["image"].max() <= 1
    assert arrays["mask"].shape == (5, 4) and set(np.unique(arrays["mask"])) <= {0, 1}
    assert "dynamic dims" in caplog.text and "'mask'" in caplog.text
    again = load_arrays(source, specs, Path)
    np.testing.assert_array_equal(again["image"], arrays["image"])


def test_random_data_uses_given_shapes(tiny_transformer_onnx):
    specs = onnx_input_specs(tiny_transformer_onnx)
    source = DataSource(random={"num_samples": 3, "shapes": {"input_ids": [2, 8]}})
    arrays = load_arrays(source, specs, Path)
    assert arrays["input_ids"].shape == (6, 8) and arrays["input_ids"].dtype == np.int64
    assert arrays["input_ids"].min() >= 0 and arrays["input_ids"].max() < 100


def test_random_data_with_unknown_names(two_input):
    source = DataSource(random={"num_samples": 1, "shapes": {"imagee": [1, 3, 4, 4]}})
    with pytest.raises(StageFailed, match=r"inputs the model does not have: \['imagee'\]"):
        load_arrays(source, onnx_input_specs(two_input), Path)


def test_random_shape_conflicting_with_a_static_dim(two_input):
    source = DataSource(random={"num_samples": 1, "shapes": {"image": [1, 3, 8, 8]}})
    with pytest.raises(StageFailed, match="dimension 2 is 8, the model expects 4"):
        load_arrays(source, onnx_input_specs(two_input), Path)


# --- checking -----------------------------------------------------------------------------------------------


def good_arrays():
    return {"image": np.zeros((2, 3, 4, 4), np.float32), "mask": np.zeros((2, 4), np.int64)}


def check_fails(arrays, specs, *fragments):
    with pytest.raises(StageFailed) as caught:
        check_arrays(arrays, specs)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "model inputs: " + ", ".join(spec.describe() for spec in specs) in message


def test_check_accepts_matching_arrays(two_input):
    check_arrays(good_arrays(), onnx_input_specs(two_input))


def test_check_missing_and_extra_inputs(two_input):
    arrays = good_arrays()
    arrays["maks"] = arrays.pop("mask")
    check_fails(arrays, onnx_input_specs(two_input), "input 'mask' is missing",
                "array 'maks' that is not a model input")


def test_check_dtype(two_input):
    arrays = good_arrays() | {"mask": np.zeros((2, 4), np.int32)}
    check_fails(arrays, onnx_input_specs(two_input), "input 'mask': dtype int32, the model expects int64",
                "astype('int64')")


def test_check_rank(two_input):
    arrays = good_arrays() | {"image": np.zeros((2, 3, 4), np.float32)}
    check_fails(arrays, onnx_input_specs(two_input), "input 'image': rank 3 (shape [2, 3, 4]), the model "
                "expects rank 4 [1, 3, 4, 4]")


def test_check_static_dim(two_input):
    arrays = good_arrays() | {"mask": np.zeros((2, 5), np.int64)}
    check_fails(arrays, onnx_input_specs(two_input), "input 'mask': dimension 1 is 5, the model expects 4")


def test_check_empty_data_set(two_input):
    arrays = {"image": np.zeros((0, 3, 4, 4), np.float32), "mask": np.zeros((0, 4), np.int64)}
    check_fails(arrays, onnx_input_specs(two_input), "input 'image': the data set is empty")
    check_fails({}, onnx_input_specs(two_input), "the data set is empty (no arrays)")


def test_check_static_batch_and_row_counts(tmp_path):
    path = two_input_model(tmp_path / "b2.onnx", image_shape=(2, 3, 4, 4))
    specs = onnx_input_specs(path)
    arrays = {"image": np.zeros((3, 3, 4, 4), np.float32), "mask": np.zeros((3, 4), np.int64)}
    check_fails(arrays, specs, "3 rows along axis 0 is not a multiple of the model's static batch 2")
    arrays = {"image": np.zeros((4, 3, 4, 4), np.float32), "mask": np.zeros((2, 4), np.int64)}
    check_fails(arrays, specs, "different numbers of rows along axis 0: {'image': 4, 'mask': 2}")


def test_iter_batches():
    arrays = {"a": np.arange(5), "b": np.arange(10).reshape(5, 2)}
    batches = list(iter_batches(arrays, 2))
    assert [b["a"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert batches[1]["b"].tolist() == [[4, 5], [6, 7]]
    assert len(list(iter_batches(arrays, 2, drop_last=True))) == 2
    with pytest.raises(StageFailed, match="different numbers of rows"):
        list(iter_batches({"a": np.arange(2), "b": np.arange(3)}, 1))


# --- model-file helpers -------------------------------------------------------------------------------------


def test_private_copy_brings_external_data(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    model = onnx.load(str(two_input_model(tmp_path / "m.onnx")))
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((4,), np.float32) * 2, "weight"))
    onnx.save(model, str(source / "m.onnx"), save_as_external_data=True, location="m.weights",
              size_threshold=0)
    copy = private_model_copy(source / "m.onnx", tmp_path / "work")
    assert copy == tmp_path / "work" / "model.onnx" and (tmp_path / "work" / "m.weights").is_file()
    loaded = onnx.load(str(copy))
    assert numpy_helper.to_array(loaded.graph.initializer[0]).tolist() == [2, 2, 2, 2]
    (source / "m.weights").unlink()
    with pytest.raises(StageFailed, match=r"external data 'm\.weights'"):
        private_model_copy(source / "m.onnx", tmp_path / "again")


def test_node_patterns_and_op_types(two_input):
    check_node_patterns(two_input, {"nodes_to_exclude": ["sca", "cast_.*"], "nodes_to_quantize": None})
    with pytest.raises(StageFailed, match="nodes_to_exclude: 'conv' matches no node"):
        check_node_patterns(two_input, {"nodes_to_exclude": ["conv"]})
    with pytest.raises(StageFailed, match="not a valid regular expression"):
        check_node_patterns(two_input, {"nodes_to_exclude": ["(unclosed"]})
    assert check_op_types(two_input, "op_types_to_exclude", ["Mul", "Conv"]) == ["Conv"]


def test_module_is_cheap_to_import():
    code = ("import sys, trtflow_stages.data; "
            "print(sorted({'numpy', 'onnx', 'torch', 'modelopt'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- reading batch by batch ---------------------------------------------------------------------------------


def test_dataset_batches_run_across_files_in_order(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    for index in range(3):
        np.savez(folder / f"part{index}.npz", input=np.full((3, 16), index, dtype=np.float32))
    dataset = open_dataset(DataSource(path="calib"), MLP_SPECS, resolver(tmp_path))
    assert dataset.rows == 9 and dataset.num_batches(2) == 5 and dataset.num_batches(2, drop_last=True) == 4
    firsts = [batch["input"][:, 0].tolist() for batch in dataset.batches(2)]
    assert firsts == [[0, 0], [0, 1], [1, 1], [2, 2], [2]]
    assert [b["input"][:, 0].tolist() for b in dataset.batches(4, drop_last=True)] == [[0, 0, 0, 1], [1, 1, 2, 2]]
    # Every pass reads the data again from its start.
    assert [b["input"].shape[0] for b in dataset.batches(9)] == [9]


def test_dataset_reads_npy_and_fortran_ordered_arrays(tmp_path):
    x = np.arange(5 * 16, dtype=np.float32).reshape(5, 16)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "f.npz", input=np.asfortranarray(x))
    for name in ("x.npy", "f.npz"):
        dataset = open_dataset(DataSource(path=name), MLP_SPECS, resolver(tmp_path))
        np.testing.assert_array_equal(np.concatenate([b["input"] for b in dataset.batches(2)]), x)


def test_dataset_is_checked_from_headers_before_reading(tmp_path, two_input):
    np.savez(tmp_path / "bad.npz", image=np.zeros((3, 3, 4, 4), np.float32), mask=np.zeros((2, 4), np.int64))
    with pytest.raises(StageFailed, match=r"different numbers of rows along axis 0: \{'image': 3, 'mask': 2\}"):
        open_dataset(DataSource(path="bad.npz"), onnx_input_specs(two_input), resolver(tmp_path))
    folder = tmp_path / "parts"
    folder.mkdir()
    np.savez(folder / "a.npz", input=np.zeros((2, 16), np.float32))
    np.savez(folder / "b.npz", input=np.zeros((2, 16), np.float64))
    with pytest.raises(StageFailed, match=r"'input' is float64\[2, 16\] in .*b.npz but float32\[2, 16\]"):
        open_dataset(DataSource(path="parts"), MLP_SPECS, resolver(tmp_path))


def test_dataset_holds_one_batch_not_the_data_set(tmp_path):
    """Drawing batches of a 32 MB file allocates about one batch (numpy reports its allocations to tracemalloc)."""
    import tracemalloc

    width = 8192
    specs = [InputSpec(name="x", dtype="float32", shape=("batch", width))]
    np.savez(tmp_path / "big.npz", x=np.ones((1024, width), np.float32))  # 32 MiB
    dataset = open_dataset(DataSource(path="big.npz"), specs, resolver(tmp_path))
    batch_bytes = 16 * width * 4  # 0.5 MiB
    tracemalloc.start()
    try:
        rows = sum(batch["x"].shape[0] for batch in dataset.batches(16))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == 1024
    assert peak < 6 * batch_bytes, f"peak {peak / 2**20:.1f} MiB while reading 0.5 MiB batches"


def test_batch_rows_follow_a_static_batch():
    dynamic = [InputSpec("x", "float32", ("batch", 4))]
    static = [InputSpec("x", "float32", (8, 4))]
    assert batch_rows(dynamic, None) == (1, False) and batch_rows(dynamic, 4) == (4, False)
    assert batch_rows(static, None) == (8, True) and batch_rows(static, 8) == (8, True)
    with pytest.raises(ValueError, match="batch size 4 but the model's batch dimension is fixed at 8"):
        batch_rows(static, 4)
