"""common.plot: learning curves from run directories to PNG."""

import json

import numpy as np
import pytest

from common import plot


def fake_run(path, per_seed, eval_every=2):
    """A run directory whose metrics.jsonl holds `per_seed[epoch]` returns (None: no episode
    ended)."""
    path.mkdir()
    lines = []
    for epoch, seeds in enumerate(per_seed, start=1):
        finite = [s for s in seeds if s is not None]
        record = {
            "epoch": epoch,
            "env_steps": 100 * epoch,
            "sps": 1.0,
            "loss/value": 0.5,
            "episode/return": float(np.mean(finite)) if finite else None,
            "episode/return_per_seed": seeds,
        }
        if epoch % eval_every == 0:
            record["eval/return"] = 7.0 * epoch
        lines.append(json.dumps(record))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_load_curve_keeps_each_seed_and_only_epochs_with_the_metric(tmp_path):
    run = fake_run(tmp_path / "a", [[1.0, 3.0], [None, 5.0], [None, None], [4.0, 8.0]])
    steps, values = plot.load_curve(run, "episode/return")
    np.testing.assert_array_equal(steps, [100, 200, 400])  # epoch 3: no episode ended in any seed
    np.testing.assert_array_equal(values, [[1.0, 3.0], [np.nan, 5.0], [4.0, 8.0]])
    steps, values = plot.load_curve(run, "eval/return")  # logged every 2nd epoch, no per-seed list
    np.testing.assert_array_equal(steps, [200, 400])
    np.testing.assert_array_equal(values, [[14.0], [28.0]])


def test_cli_writes_a_png_of_several_runs(tmp_path, capsys):
    a = fake_run(tmp_path / "a", [[float(i), float(2 * i)] for i in range(30)])
    b = fake_run(tmp_path / "b", [[float(i)] for i in range(30)])
    out = plot.main([str(a), str(b), "--out", str(tmp_path / "c.png")])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().out


def test_labels_and_the_goal_line_are_drawn(tmp_path, monkeypatch):
    import matplotlib.figure

    drawn = {}

    def savefig(figure, out, **kwargs):
        (ax,) = figure.axes
        drawn["legend"] = [text.get_text() for text in ax.get_legend().get_texts()]
        drawn["goal"] = list(ax.lines[-1].get_ydata())

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    a = fake_run(tmp_path / "a", [[float(i), float(2 * i)] for i in range(30)])
    b = fake_run(tmp_path / "b", [[float(i)] for i in range(30)])
    labels = ["awr", "awr --q-value --n-samples 4"]
    plot.main([str(a), str(b), "--label", labels[0], "--label", labels[1], "--goal", "475"])
    assert drawn["legend"] == ["awr (2 seeds)", "awr --q-value --n-samples 4", "goal 475"]
    assert drawn["goal"] == [475.0, 475.0]


@pytest.mark.parametrize(
    "make, args, message",
    [
        (lambda p: p / "missing", [], "no metrics.jsonl"),
        (
            lambda p: fake_run(p / "r", [[1.0]]),
            ["--metric", "eval/return"],
            "no epoch logged eval/return",
        ),
        (
            lambda p: fake_run(p / "r", [[1.0]]),
            ["--label", "a", "--label", "b"],
            "give one per run",
        ),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, capsys, make, args, message):
    with pytest.raises(SystemExit):
        plot.main([str(make(tmp_path)), *args, "--out", str(tmp_path / "x.png")])
    assert message in capsys.readouterr().err


def test_a_real_run_of_two_seeds_is_drawn_with_its_spread(tmp_path):
    from algos import ppo_joint
    from common import run

    config = ppo_joint.Config(
        num_envs=4,
        num_steps=16,
        total_steps=4 * 16 * 8,
        num_seeds=2,
        eval_every=4,
        eval_episodes=2,
        out_dir=str(tmp_path / "run"),
    )
    summary = run.train(config, ppo_joint.make_trainer, "ppo_joint").summary
    steps, values = plot.load_curve(tmp_path / "run", "eval/return")
    np.testing.assert_array_equal(steps, [256, 512])
    np.testing.assert_allclose(values[-1], summary["eval_return_per_seed"])
    steps, values = plot.load_curve(tmp_path / "run", "episode/return")
    assert values.shape[1] == 2 and len(steps) >= 4
    out = plot.main([str(tmp_path / "run"), "--out", str(tmp_path / "run.png")])
    assert out.read_bytes()[:4] == b"\x89PNG"
