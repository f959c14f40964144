"""Issue 35, checkpoints and resume state: a distill checkpoint that cannot be loaded, holds the wrong objects,
needs code to unpickle or comes from another run is refused in one line naming the fix, and the fix it names
works (the "different run" refusal once suggested running without --resume, which the next run refused).
Nothing is loaded from a refused checkpoint and it is left as it was."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from drafters_common import saved_target_and_drafter

from specpress.cli import cli
from specpress.errors import CheckpointError, Interrupted

TRAIN = ["--family", "eagle3", "--steps", "3", "--batch", "2", "--seq-len", "16", "--draft-vocab", "40",
         "--checkpoint-minutes", "100"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    tdir, data, drafter = saved_target_and_drafter(root)
    return root, tdir, data, drafter


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def interrupted_distill(setup, out: Path, monkeypatch) -> list:
    """Run distill into `out`, stopped by Ctrl-C after step 2 (its checkpoint saved); returns its arguments."""
    import specpress.compress.progress as progress

    _, tdir, data, _ = setup
    args = ["distill", "--target", tdir, "--data", data, "--out", out, *TRAIN]
    real = progress.TrainProgress.update

    def stop_at_2(self, step, recent):
        real(self, step, recent)
        if step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.TrainProgress, "update", stop_at_2)
    res = invoke(*args)
    monkeypatch.setattr(progress.TrainProgress, "update", real)
    assert isinstance(res.exception, Interrupted), (res.output, res.exception)
    assert (out.with_name(out.name + ".partial") / "state.pt").is_file()
    return args


class Payload:
    """A pickle that runs code when loaded (writes a marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def _damage(how: str, state: Path, marker: Path) -> None:
    if how == "random bytes":
        state.write_bytes(random.Random(0).randbytes(4096))
    elif how == "empty":
        state.write_bytes(b"")
    elif how == "code pickle":
        with open(state, "wb") as f:
            pickle.dump({"student": Payload(marker)}, f)
    elif how == "a list":
        torch.save([1, 2, 3], state)
    elif how == "missing keys":
        good = torch.load(state, weights_only=True)
        torch.save({k: v for k, v in good.items() if k not in ("optimizer", "rng")}, state)
    elif how == "wrong tensors":
        good = torch.load(state, weights_only=True)
        good["student"] = {k: torch.zeros(3) for k in good["student"]}
        torch.save(good, state)


DAMAGE = {"random bytes": "not a distill checkpoint of plain tensors: torch's weights-only reader refused it", "empty": "not a readable distill checkpoint",
          "code pickle": "specpress never unpickles code", "a list": "holds a list, not a specpress checkpoint",
          "missing keys": "no 'optimizer'", "wrong tensors": "does not fit this run's student"}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_in_one_line_and_the_fix_works(setup, tmp_path, monkeypatch, how):
    out = tmp_path / "d"
    args = interrupted_distill(setup, out, monkeypatch)
    state = out.with_name("d.partial") / "state.pt"
    marker = tmp_path / "pwned"
    _damage(how, state, marker)
    damaged = state.read_bytes()
    res = invoke(*args, "--resume")
    assert isinstance(res.exception, CheckpointError), (res.output, res.exception)
    msg = str(res.exception)
    assert "\n" not in msg and str(state) in msg and DAMAGE[how] in msg, msg
    assert "weights_only=False" not in msg and "will likely succeed" not in msg
    assert "--force instead of --resume" in msg, msg
    assert not marker.exists() and state.read_bytes() == damaged  # nothing ran, nothing changed
    res = invoke(*[a if a != "--resume" else "--force" for a in [*args, "--resume"]])  # the fix it names
    assert res.exit_code == 0, (res.output, res.exception)
    assert (out / "config.json").is_file() and not out.with_name("d.partial").exists()


def test_a_checkpoint_of_another_run_names_a_fix_that_works(setup, tmp_path, monkeypatch):
    out = tmp_path / "d"
    args = interrupted_distill(setup, out, monkeypatch)
    state = out.with_name("d.partial") / "state.pt"
    kept = state.read_bytes()
    res = invoke(*args, "--seed", "1", "--resume")
    assert isinstance(res.exception, CheckpointError), (res.output, res.exception)
    msg = str(res.exception)
    assert "from a different run" in msg and "config.seed is 0 there but 1 now" in msg and "\n" not in msg, msg
    assert "rerun with the original settings" in msg and "--force instead of --resume" in msg, msg
    assert state.read_bytes() == kept
    res = invoke(*args, "--seed", "1", "--force")  # what the message says to run: not refused
    assert res.exit_code == 0, (res.output, res.exception)
    assert "discarding the interrupted run" in res.output


def test_the_original_settings_still_resume(setup, tmp_path, monkeypatch):
    out = tmp_path / "d"
    args = interrupted_distill(setup, out, monkeypatch)
    res = invoke(*args, "--resume")
    assert res.exit_code == 0, (res.output, res.exception)


def test_a_legacy_weight_pickle_is_refused_without_torchs_advice(setup, tmp_path):
    from specpress.models.io import read_weights

    marker = tmp_path / "pwned"
    d = tmp_path / "m"
    d.mkdir()
    with open(d / "pytorch_model.bin", "wb") as f:
        pickle.dump({"w": Payload(marker)}, f)
    with pytest.raises(CheckpointError) as err:
        read_weights(d)
    msg = str(err.value)
    assert "specpress never unpickles code" in msg and "weights_only" not in msg and "\n" not in msg, msg
    assert not marker.exists()
    torch.save([torch.zeros(2)], d / "pytorch_model.bin")  # loads, but is no state dict
    with pytest.raises(CheckpointError, match="holds a list, not a state dict of named tensors"):
        read_weights(d)


def test_a_zoo_checkpoint_holding_the_wrong_objects_is_refused(tmp_path):
    from specpress.zoo.train import load_state

    f = tmp_path / "state.pt"
    torch.save({"model": {}, "step": "three"}, f)
    with pytest.raises(CheckpointError, match=r"no 'optimizer'.*'step' is a str.*--no-resume"):
        load_state(f)
