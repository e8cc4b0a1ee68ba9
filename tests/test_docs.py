"""The docs stay true: config reference generated from the code, every logged key documented."""
import dataclasses
import re
from pathlib import Path

from tclock import runlog
from tclock.config import TrainConfig, markdown_reference
from tclock.loop import train

ROOT = Path(__file__).resolve().parent.parent


def test_config_reference_is_generated_from_the_code():
    doc = (ROOT / "docs" / "config.md").read_text()
    assert doc == markdown_reference(), "regenerate docs/config.md (command at its top)"
    for f in dataclasses.fields(TrainConfig):
        assert f"`{f.name}`" in doc


def test_every_logged_metric_key_is_documented(tmp_path):
    cfg = TrainConfig(num_envs=16, unroll_length=16, num_minibatches=4, num_epochs=1, seeds=1, policy_hidden=(16,),
                      value_hidden=(16,), gdc_every=1, gdc_minibatch=32, total_steps=16 * 16 * 2, progress=False,
                      out=str(tmp_path / "keys"))
    train(cfg)
    logged = set().union(*[r.keys() for r in runlog.read_metrics(cfg.out)])
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`([a-z0-9_]+)`", doc))
    assert logged - documented == set()


def test_readme_names_the_three_commands():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[dev]"' in readme and "python -m pytest -q" in readme and "tclock sweep" in readme
