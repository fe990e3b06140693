"""Strict input (issue 43): lossy state dicts, empty layers, a pipeline's schedule and microbatches,
and table shapes too large for memory are refused where they are given, naming what was wrong."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from virtualpar import UsageError, nn
from virtualpar.pipeline import Pipeline, PipelinedOperation


def _linear64() -> nn.Linear:
    return nn.Linear(2, 2, dtype=np.float64)


@pytest.mark.parametrize("value, said", [
    (np.array([[1 + 2j, 0], [0, 1]]),
     "'weight' is complex128, which cannot be made a float64 array without loss (the imaginary "
     "part would be dropped)"),
    (np.full((2, 2), 2**53 + 1), "'weight' holds int64 values that float64 cannot hold exactly"),
    (np.array([["a", "b"], ["c", "d"]]), "'weight' cannot be made a float64 array: it holds <U1 values"),
])
def test_a_lossy_value_is_refused_with_its_key_and_nothing_is_set(value, said):
    lin = _linear64()
    before = lin.state_dict()
    with pytest.raises(UsageError, match=re.escape(said)):
        lin.load_state_dict({"weight": value, "bias": np.ones(2)})
    np.testing.assert_array_equal(lin.weight, before["weight"])
    np.testing.assert_array_equal(lin.bias, before["bias"])  # all or nothing: bias was fine, but not set


def test_float_into_an_int_parameter_is_refused():
    class Counts(nn.Module):
        def __init__(self):
            self.n = np.zeros(3, np.int64)

    with pytest.raises(UsageError, match=r"'n' is float64, .*int64 .*the fraction would be cut off"):
        Counts().load_state_dict({"n": np.array([0.5, 1.0, 2.0])})


@pytest.mark.parametrize("src", [np.float32, np.float64, np.int64, np.int8, bool])
def test_widening_and_exact_casts_keep_working(src):
    lin = _linear64()
    w = np.array([[1, 0], [3, 1]]).astype(src)
    lin.load_state_dict({"weight": w, "bias": np.zeros(2, src)})
    assert lin.weight.dtype == np.float64
    np.testing.assert_array_equal(lin.weight, w.astype(np.float64))


def test_float64_into_float32_rounds_as_astype_does():
    lin = nn.Linear(2, 2)
    w = np.array([[0.1, 0.2], [0.3, 0.4]])
    lin.load_state_dict({"weight": w, "bias": np.zeros(2)})
    assert lin.weight.dtype == np.float32
    np.testing.assert_array_equal(lin.weight, w.astype(np.float32))


@pytest.mark.parametrize("make, said", [
    (lambda: nn.Linear(0, 3), "Linear: in_features must be an int >= 1, got 0"),
    (lambda: nn.Linear(3, 0), "Linear: out_features must be an int >= 1, got 0"),
    (lambda: nn.Linear(-2, 3), "Linear: in_features must be an int >= 1, got -2"),
    (lambda: nn.Embedding(5, 0), "Embedding: embedding_dim must be an int >= 1, got 0"),
    (lambda: nn.LayerNorm(-1), "LayerNorm: normalized_shape must be an int >= 1, got -1"),
    (lambda: nn.RNN(0, 3), "RNN: input_size must be an int >= 1, got 0"),
])
def test_layers_refuse_zero_or_negative_sizes(make, said):
    with pytest.raises(UsageError, match=re.escape(said)):
        make()


def _pipeline() -> Pipeline:
    return Pipeline(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), [1])


@pytest.mark.parametrize("microbatches", [0, -1, 2.0, True, "4", None])
def test_pipelined_operation_checks_microbatches_at_construction(microbatches):
    said = f"microbatches must be a positive int, got {microbatches!r}"
    with pytest.raises(UsageError, match=re.escape(said)):
        PipelinedOperation(_pipeline(), "1f1b", microbatches)


def test_pipelined_operation_checks_the_schedule_name_at_construction():
    with pytest.raises(UsageError, match=r"unknown schedule '1f2b'; choose one of gpipe, 1f1b, .*zbv"):
        PipelinedOperation(_pipeline(), "1f2b", 2)
    assert PipelinedOperation(_pipeline(), "gpipe", np.int64(2)).microbatches == 2


def test_a_table_shape_too_large_for_memory_is_refused_before_any_allocation(monkeypatch):
    from virtualpar import sysmem
    from virtualpar.tensor_parallel.table import check_shape_fits

    monkeypatch.setattr(sysmem, "physical_available", lambda: 1 << 30)
    check_shape_fits((1024, 512, 1024))  # 2*(0.5M + 0.5M + 2*1M)*4 = 24 MiB
    said = (r"MatMul m,k,n = \(8192, 8192, 8192\) in float32 needs about 2 GiB .* "
            r"this machine has 1 GiB available")
    with pytest.raises(UsageError, match=said):
        check_shape_fits((8192, 8192, 8192))  # 2*(64M + 64M + 2*64M) items of 4 B
    with pytest.raises(UsageError, match=r"FeedForward b,s,m,h = .* float64 needs about"):
        check_shape_fits((64, 1024, 1024, 4096), ffn=True, dtype=np.float64)


def test_policies_command_refuses_a_huge_shape_with_a_message_not_a_numpy_error():
    argv = [sys.executable, "-m", "virtualpar", "policies", "--mesh", "x=2", "--shape",
            "100000000,100000000,100000000"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2  # a usage error, found before any device starts
    said = "error: shape MatMul m,k,n = (100000000, 100000000, 100000000) in float32 needs about"
    assert said in done.stderr and "available" in done.stderr
    assert "_ArrayMemoryError" not in done.stderr and "Traceback" not in done.stderr
