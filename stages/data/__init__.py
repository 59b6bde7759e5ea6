"""Model-input data shared by the stages that feed a model (quantize calibration, validate, benchmark).

- `specs`: the model's inputs and how data must fit them;
- `sources`: where data comes from (files, a callable, random) and opening it;
- `dataset`: reading it batch by batch.
"""

from .dataset import ArrayHeader, Dataset
from .sources import DataSource, RandomData, data_files, iter_batches, load_arrays, num_rows, open_dataset
from .specs import InputSpec, batch_rows, check_arrays, onnx_input_specs

__all__ = [
    "ArrayHeader",
    "DataSource",
    "Dataset",
    "InputSpec",
    "RandomData",
    "batch_rows",
    "check_arrays",
    "data_files",
    "iter_batches",
    "load_arrays",
    "num_rows",
    "onnx_input_specs",
    "open_dataset",
]
