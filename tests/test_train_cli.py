"""``virtualpar train``: the loss falls, the figures are the trainer's and the closed forms', bad
flags are usage errors (exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from virtualpar import nn
from virtualpar.cli import main
from virtualpar.commands.train import synthetic_batch
from virtualpar.parallel.costs import zero_memory


def run_json(capsys, *flags: str) -> dict:
    assert main(["train", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_loss_falls_and_every_figure_is_reported(capsys):
    out = run_json(capsys, "--mesh", "dp=2,pp=2", "--microbatches", "2", "--zero", "1", "--steps", "8")
    losses = [s["loss"] for s in out["steps"]]
    assert len(losses) == 8 and losses[-1] < 0.7 * losses[0]
    for s in out["steps"]:
        assert s["tokens_per_second"] > 0 and s["modelled_step_seconds"] > 0 and 0 < s["mfu"] < 1
    assert out["config"] == {"dp": 2, "tp": 1, "pp": 2, "cp": 1, "microbatches": 2, "schedule": "1f1b",
                             "zero": 1, "sequence_parallel": False, "recompute": False}
    assert len(out["memory"]) == 4
    for dev in out["memory"]:  # ZeRO's closed form holds exactly for what the device measured
        for kind in ("params", "grads", "optimizer"):
            assert dev["measured"][kind] == dev["closed_form"][kind]


def test_zero_memory_in_the_table_is_the_closed_form_of_the_model(capsys):
    out = run_json(capsys, "--mesh", "dp=2", "--microbatches", "1", "--zero", "3", "--steps", "1")
    psi = nn.GPT.preset("tiny").num_parameters()
    want = zero_memory(psi, 2, 3, 4, 8)
    for dev in out["memory"]:
        assert dev["measured"]["params"] == want["params"] == psi * 4 / 2


def test_text_output_shows_steps_and_the_memory_table(capsys):
    assert main(["train", "--mesh", "tp=2,cp=2", "--sequence-parallel", "--recompute", "--microbatches", "1",
                 "--steps", "2"]) == 0
    text = capsys.readouterr().out
    assert "tokens/s (wall)" in text and "modelled step" in text and "MFU" in text
    assert "ZeRO form" in text and "Megatron form" in text
    assert text.count("\n    1  ") >= 1  # step 1's line


def test_synthetic_data_is_a_learnable_deterministic_pattern():
    tokens, targets = synthetic_batch(3, 4, 10, 256, seed=1)
    again, _ = synthetic_batch(3, 4, 10, 256, seed=1)
    np.testing.assert_array_equal(tokens, again)
    np.testing.assert_array_equal(targets[:, :-1], tokens[:, 1:])  # the next token
    np.testing.assert_array_equal(targets, (tokens + 1) % 16)  # ... which the current one determines
    assert not np.array_equal(tokens, synthetic_batch(4, 4, 10, 256, seed=1)[0])


@pytest.mark.parametrize("flags, words", [
    (["--mesh", "dp=2,xx=2"], "unknown axes ['xx']"),
    (["--mesh", "tp=8"], "heads=4 do not split over tp=8"),
    (["--mesh", "dp=2", "--batch", "3"], "batch=3 does not split"),
    (["--mesh", "cp=2", "--cp", "4"], "--cp 4 and --mesh's cp=2 disagree"),
    (["--mesh", "pp=4", "--schedule", "zbv"], "layers=4 do not split"),
])
def test_a_configuration_that_does_not_fit_is_a_usage_error(capsys, flags, words):
    assert main(["train", "--steps", "1", *flags]) == 2
    assert words in capsys.readouterr().err


def test_a_learning_rate_that_is_not_positive_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--steps", "1", "--lr", "0"])
    assert exit_.value.code == 2 and "--lr: must be a number > 0, got 0" in capsys.readouterr().err


def _weights(path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f}


def _train(capsys, tmp_path, name: str, mesh: str, steps: int, *flags: str) -> tuple[dict, dict]:
    out = run_json(capsys, "--mesh", mesh, "--microbatches", "2", "--zero", "1", "--dtype", "float64",
                   "--steps", str(steps), "--weights", str(tmp_path / f"{name}.npz"), *flags)
    return out, _weights(tmp_path / f"{name}.npz")


@pytest.mark.parametrize("first, then", [("dp=2,pp=2", "dp=2,pp=2"), ("dp=2,tp=2", "tp=4")],
                         ids=["same-mesh", "dp2-tp2-to-tp4"])
def test_four_steps_saved_then_four_resumed_are_eight_straight_steps(capsys, tmp_path, first, then):
    """The checkpoint carries the weights, AdamW's moments and the step, which is also the data
    position: the resumed run continues the straight run exactly (float64; across meshes to rounding,
    which Adam's division by sqrt(v) amplifies: tp sums partial products in another order)."""
    straight, want = _train(capsys, tmp_path, "straight", then, 8)
    saved, _ = _train(capsys, tmp_path, "first", first, 4, "--save", str(tmp_path / "ck"))
    assert saved["checkpoint"] == str(tmp_path / "ck")
    resumed, got = _train(capsys, tmp_path, "resumed", then, 4, "--resume", str(tmp_path / "ck"))
    assert [s["step"] for s in resumed["steps"]] == [4, 5, 6, 7]
    assert sorted(got) == sorted(want)
    tol = 0 if first == then else 1e-9
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=tol, err_msg=k)
    if first == then:
        assert resumed["weights_l2"] == straight["weights_l2"]
    losses = [s["loss"] for s in straight["steps"]]
    np.testing.assert_allclose([s["loss"] for s in resumed["steps"]], losses[4:], rtol=0, atol=tol or 1e-15)


def test_resume_from_a_folder_without_a_checkpoint_exits_2(capsys, tmp_path):
    assert main(["train", "--steps", "1", "--resume", str(tmp_path)]) == 2
    assert str(tmp_path) in capsys.readouterr().err


def test_help_documents_every_flag_with_its_unit(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for flag in ("--model", "--mesh", "--cp", "--microbatches", "--schedule", "--zero", "--sequence-parallel",
                 "--recompute", "--steps", "--batch", "--seq", "--json", "--trace", "--resume", "--save",
                 "--weights", "--hardware", "--timeout"):
        assert flag in text
    assert "ROWS" in text and "TOKENS" in text and "seconds" in text


def test_trace_and_weights_files_are_written(capsys, tmp_path):
    trace, weights = tmp_path / "t.json", tmp_path / "w.npz"
    assert main(["train", "--mesh", "pp=2", "--microbatches", "2", "--steps", "1", "--trace", str(trace),
                 "--weights", str(weights)]) == 0
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any("1F0" in str(e.get("name", "")) or e.get("name") == "F" for e in events)
    with np.load(weights) as got:
        assert sorted(got) == sorted(nn.GPT.preset("tiny").state_dict())
