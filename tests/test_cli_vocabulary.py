"""One CLI vocabulary: exit codes and the one error format, `--json [FILE]` meaning one thing, `prompts`,
`zoo build --force`, and the old spellings (kept one release) warning while computing what the new ones do."""

from __future__ import annotations

import json

import pytest
import torch
from cli_common import run_main
from drafters_common import make, save_with_tokenizer, tiny_target

from specpress.models.drafter_io import load_drafter, save_drafter
from specpress.models.target import TargetConfig, TargetModel


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(target dir with a tokenizer, eagle3 drafter dir, prompts file), all tiny and random."""
    tmp = tmp_path_factory.mktemp("vocab")
    t = TargetModel(TargetConfig(**{**tiny_target().config.__dict__, "eos_token_id": 0}))
    t.load_state_dict(tiny_target().state_dict())
    tdir, _ = save_with_tokenizer(t, tmp)
    ddir = save_drafter(make("eagle3", t), tmp / "eagle3")
    prompts = tmp / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"input_ids": p}) for p in ([5, 9, 13, 2], [30, 31])) + "\n")
    return tdir, ddir, prompts


def test_exit_codes_follow_one_rule_and_errors_print_one_way(saved, tmp_path):
    tdir, ddir, prompts = saved
    base = ["bench", "--target", tdir, "--prompts", prompts, "--max-new-tokens", "3"]
    usage = [run_main(*base, "--nope"),  # Click's own parse error
             run_main(*base, "--backend", "nope"),
             run_main(*base, "--compare-backend", "torch", "--drafter", ddir),  # specpress's UsageError
             run_main("nope")]
    for res in usage:
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and lines[0].startswith("error: ") and lines[-1].startswith("Try 'specpress")
        assert "Usage:" not in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "afile").write_text("x")
    other = [run_main("bench", "--target", tmp_path / "nope", "--prompts", prompts, "--max-new-tokens", "3"),
             run_main("zoo", "build", "--out", tmp_path / "afile"),  # an output in the way: not the command line
             run_main(*base, "--max-new-tokens", "500", "--drafter", ddir)]  # past the target's context
    for res in other:  # (a progress bar may leave an empty line first)
        assert res.exit_code == 1 and res.stderr.strip().startswith("error: ") and "Try '" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_json_means_one_thing_in_bench_and_inspect(saved, tmp_path):
    tdir, ddir, prompts = saved
    base = ["bench", "--target", tdir, "--drafter", ddir, "--prompts", prompts, "--max-new-tokens", "4"]
    out = tmp_path / "b.json"
    to_file, bare = run_main(*base, "--json", out), run_main(*base, "--json")
    assert to_file.exit_code == bare.exit_code == 0, (to_file.stderr, bare.stderr)
    written, printed = json.loads(out.read_text()), json.loads(bare.stdout)
    assert printed["outputs"] == written["outputs"] and printed["tau"] == written["tau"]  # the same full object
    res = run_main(*base)  # no --json: the summary without outputs
    assert res.exit_code == 0 and "outputs" not in json.loads(res.stdout)
    info = tmp_path / "i.json"
    forms = [run_main("inspect", ddir, "--json"), run_main("inspect", "--json", ddir),  # the flag before PATH
             run_main("inspect", ddir, "--json", "-")]
    assert all(r.exit_code == 0 for r in forms) and len({r.stdout for r in forms}) == 1
    assert run_main("inspect", ddir, "--json", info).exit_code == 0
    assert json.loads(info.read_text()) == json.loads(forms[0].stdout)
    again = run_main("inspect", ddir, "--json", info)
    assert again.exit_code == 1 and "--force" in again.stderr
    assert run_main("inspect", ddir, "--json", info, "--force").exit_code == 0


def test_json_means_one_thing_in_plan(saved, tmp_path):
    """plan's --json as bench's: FILE, or bare (also written before the planned command line) printing only
    the JSON object on stdout."""
    tdir, ddir, prompts = saved
    cmd = ["bench", "--target", tdir, "--drafter", ddir, "--prompts", prompts, "--max-new-tokens", "4"]
    out = tmp_path / "plan.json"
    forms = [run_main("plan", "--json", out, *cmd), run_main("plan", "--json", *cmd),
             run_main("plan", "--json", "-", *cmd)]
    assert all(r.exit_code == 0 for r in forms), [r.stderr for r in forms]
    objects = [json.loads(out.read_text())] + [json.loads(r.stdout) for r in forms[1:]]
    assert len({json.dumps(o["phases"], sort_keys=True) for o in objects}) == 1 and objects[0]["command"] == "bench"
    assert "peak about" in forms[0].stdout  # with a FILE the plan is shown too
    assert run_main("plan", "--json", out, *cmd).exit_code == 1  # an existing FILE needs --force


def test_prompts_command_writes_what_bench_reads(saved, tmp_path):
    from specpress.models.tokenizer import load_tokenizer
    from specpress.runtime.heldout import heldout_code_prompts

    tdir, _, _ = saved
    out = tmp_path / "held.jsonl"
    res = run_main("prompts", "--target", tdir, "--n", "3", "--tokens", "8", "--out", out)
    assert res.exit_code == 0, res.stderr
    want = [list(p.ids) for p in heldout_code_prompts(load_tokenizer(tdir), 3, 8, 0)]
    assert [json.loads(line)["input_ids"] for line in out.read_text().splitlines()] == want
    again = run_main("prompts", "--target", tdir, "--n", "3", "--tokens", "8", "--out", out)
    assert again.exit_code == 1 and "--force" in again.stderr
    bench = run_main("bench", "--target", tdir, "--prompts", out, "--max-new-tokens", "2")
    assert bench.exit_code == 0, bench.stderr


def test_old_spellings_warn_and_compute_what_the_new_ones_do(saved, tmp_path):
    tdir, ddir, _ = saved
    q = ["quantize", "--drafter", ddir, "--scheme", "int8"]
    new, old = run_main(*q, "--out", tmp_path / "q-new", "--dtype", "bf16"), \
        run_main(*q, "--out", tmp_path / "q-old", "--float-dtype", "bfloat16")
    assert new.exit_code == old.exit_code == 0, (new.stderr, old.stderr)
    assert "warning: --float-dtype bfloat16 is deprecated" in old.stderr and "use --dtype bf16" in old.stderr
    assert "warning" not in new.stderr
    t = tiny_target()
    a, b = load_drafter(tmp_path / "q-new", t), load_drafter(tmp_path / "q-old", t)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    res = run_main(*q, "--out", tmp_path / "q-bad", "--dtype", "bfloat16")
    assert res.exit_code == 2 and "'bfloat16' is not one of 'auto', 'fp32', 'bf16', 'fp16'" in res.stderr
    hf = ["export", "hf", "--drafter", ddir, "--format", "speculators"]
    new, old = run_main(*hf, "--out", tmp_path / "h-new", "--target", tdir), \
        run_main(*hf, "--out", tmp_path / "h-old", "--verifier", tdir)
    assert new.exit_code == old.exit_code == 0, (new.stderr, old.stderr)
    assert "warning: --verifier is deprecated and will be removed in the next release; use --target" in old.stderr
    assert (tmp_path / "h-new" / "config.json").read_text() == (tmp_path / "h-old" / "config.json").read_text()
    both = run_main(*hf, "--out", tmp_path / "h-both", "--target", tdir, "--verifier", tdir)
    assert both.exit_code == 2 and "give --target only" in both.stderr
    d = ["distill", "--target", tdir, "--family", "eagle3", "--data", tdir / "tokenizer.json", "--steps", "1",
         "--batch", "1", "--seq-len", "8"]
    old = run_main(*d, "--out", tmp_path / "d-old", "--fp32")
    assert old.exit_code == 0 and "warning: --bf16 / --fp32 is deprecated" in old.stderr, old.stderr
    step = next(s for s in load_drafter(tmp_path / "d-old", t).provenance if s.get("step") == "distill")
    assert step["config"]["bf16"] is False  # --fp32 then, --dtype fp32 now


def test_zoo_build_refuses_an_existing_target_without_force(tmp_path):
    """The finished zoo target is kept (a second `zoo build` does not retrain it); --force builds it again."""
    from specpress.zoo.build import ZOO_FILES, ZOO_FORMAT

    out = tmp_path / "zoo"
    out.mkdir()
    for name in ZOO_FILES:
        (out / name).write_text(json.dumps({"format": ZOO_FORMAT}))
    res = run_main("zoo", "build", "--out", out)
    assert res.exit_code == 1 and "already holds a zoo target; pass --force" in res.stderr
    assert "--force" in run_main("zoo", "build", "--help").stdout


def _commands(group, path=()):
    import click

    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))


def test_every_help_text_is_indented_as_one_block():
    """A docstring line that starts at column 0 (a continuation written flush left) makes the common
    indent 0, and --help then prints the rest with the source's indent inside its sentences."""
    from specpress.cli import cli

    flush, n = [], 0
    for path, cmd in _commands(cli):
        n += 1
        doc = (cmd.callback.__doc__ if cmd.callback is not None else None) or ""
        lines = doc.splitlines()[1:]
        flush += [f"{' '.join(path)}: {line[:40]!r}" for line in lines if line.strip() and not line[0].isspace()]
    assert n > 10 and not flush, flush
