"""experiment=stability_fixes: Hydra's own sweep expansion of the preset gives the run count experiments/README.md
states, every cell of it composes and passes validate, and the script's stages are the preset's fixes."""

from __future__ import annotations

import copy
import re
from pathlib import Path

from conftest import compose_config
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from andrea_exp.config.validation import validate

REPO = Path(__file__).resolve().parent.parent


def cells() -> list[list[str]]:
    """Every cell's overrides, as Hydra's basic sweeper expands the preset's hydra.sweeper.params."""
    params = compose_config("experiment=stability_fixes", hydra=True).hydra.sweeper.params
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    (batch,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return batch


def test_the_run_count_is_the_readmes():
    grid = cells()
    readme = (REPO / "experiments" / "README.md").read_text()
    stated = re.search(r"`experiment=stability_fixes` is (\d+) runs", readme)
    assert len(grid) == 8 * 6 * 3 * 3 == int(stated.group(1)) == 432
    assert "432 runs" in (REPO / "conf" / "experiment" / "stability_fixes.yaml").read_text()


def test_every_cell_composes_and_validates():
    """Composed once per (fix, d_k), the cell's settings; lr and seed set on it for each cell (they change no
    composition), so each of the 432 cells passes validate."""
    by_place: dict[tuple, list[dict]] = {}
    for cell in cells():
        values = dict(line.split("=", 1) for line in cell)
        by_place.setdefault((values["fix"], values["model.d_k"]), []).append(values)
    checked = 0
    for (fix, d_k), rest in by_place.items():
        cfg = compose_config("experiment=stability_fixes", f"fix={fix}", f"model.d_k={d_k}")
        for values in rest:
            one = copy.deepcopy(cfg)  # the composed, schema-typed settings, one cell's values set on a copy
            one.train.lr, one.seed = float(values["train.lr"]), int(values["seed"])
            settings = validate(one)
            assert settings.model.d_k == int(d_k) and settings.train.lr == float(values["train.lr"])
            checked += 1
    assert checked == 432
    softcap = validate(compose_config("experiment=stability_fixes", "fix=softcap", "model.d_k=64"))
    assert softcap.model.logit_softcap == 50.0 and softcap.model.scale == "sqrt"
    z = validate(compose_config("experiment=stability_fixes", "fix=inv_qk_layernorm_z_loss", "model.d_k=4096"))
    assert (z.model.scale, z.model.qk_layernorm, z.train.z_loss) == ("inv", True, 1e-4)


def test_the_scripts_stages_are_the_presets_fixes():
    script = (REPO / "experiments" / "stability_fixes.sh").read_text()
    stages = re.search(r'^FIXES="([^"]+)"', script, re.M).group(1).split()
    swept = str(compose_config("experiment=stability_fixes", hydra=True).hydra.sweeper.params.fix).split(",")
    assert stages == swept
    assert sorted(stages) == sorted(p.stem for p in (REPO / "conf" / "fix").glob("*.yaml"))
