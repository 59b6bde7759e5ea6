"""The report lines up the top CUDA kernels of the benchmarked candidates, one column per node."""

from __future__ import annotations

from trtflow.report.documents import to_html, to_markdown


def _node(name: str, summary: dict) -> dict:
    return {"node": name, "stage": "benchmark", "status": "done", "reason": None, "duration": 2.0,
            "log_path": None, "error": None, "key": "k", "summary": summary}


def _data() -> dict:
    fp16 = {"backend": "tensorrt", "device": "cuda:0", "repeats": 1, "points": [],
            "kernel_time_per_iteration_ms": 1.25, "top_kernels": [
        {"name": "sm90_xmma_gemm_f16f16_f16f32", "percent": 71.5, "average_us": 12.5, "per_iteration": 48},
        {"name": "vectorized_layer_norm_kernel", "percent": 9.25, "average_us": 4.75, "per_iteration": 25}]}
    nvfp4 = {"backend": "tensorrt", "device": "cuda:0", "repeats": 1, "points": [],
            "kernel_time_per_iteration_ms": 2.5, "top_kernels": [
        {"name": "fp4_fake_quant_block_kernel" + "_x" * 60, "percent": 40.0, "average_us": 20.0, "per_iteration": 49},
        {"name": "sm90_xmma_gemm_f32f32", "percent": 35.0, "average_us": 18.0, "per_iteration": 48},
        {"name": "softmax_warp_forward", "percent": 5.0, "average_us": 2.5, "per_iteration": 12}]}
    return {"recipe": "precision-study", "run": {"id": "run-1", "status": "ok", "started": 0.0},
            "nodes": [_node("benchmark-fp16", fp16), _node("benchmark-nvfp4", nvfp4),
                      _node("export", {"nodes": 12})]}


def test_markdown_puts_the_top_kernels_of_candidates_side_by_side():
    text = to_markdown(_data())
    section = text[text.index("## Top CUDA kernels"):text.index("## Nodes")]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert lines[0] == "| rank | benchmark-fp16 | benchmark-nvfp4 |"
    assert lines[2] == "| kernel time / iteration | 1.25 ms | 2.5 ms |"
    assert lines[3].startswith("| 1 | sm90_xmma_gemm_f16f16_f16f32 (71.5%, 12.5 us, x48/iter) | "
                               "fp4_fake_quant_block_kernel_x_x")
    assert "...(40.0%, 20 us, x49/iter)" not in lines[3] and "... (40.0%, 20 us, x49/iter) |" in lines[3]
    assert lines[5] == "| 3 |  | softmax_warp_forward (5.0%, 2.5 us, x12/iter) |"


def test_html_has_the_kernel_table_and_a_report_without_kernels_has_none():
    page = to_html(_data())
    assert "<h2>Top CUDA kernels</h2>" in page and "<th>benchmark-nvfp4</th>" in page and "2.5 ms" in page
    data = _data()
    data["nodes"] = data["nodes"][2:]
    assert "Top CUDA kernels" not in to_markdown(data) and "Top CUDA kernels" not in to_html(data)
