"""The report's cost: its entry point loads nothing heavy before main() (the figures' spawned workers import it
again), and the static numbers a report asks for several times are computed once."""

from __future__ import annotations

import inspect
import subprocess
import sys

import andrea_exp.report.markdown  # noqa: F401  (loads every report module)
import andrea_exp.report.scale  # noqa: F401
from andrea_exp.report import static


def test_the_entry_point_and_the_figures_load_neither_torch_nor_hydra():
    code = ("import sys; import andrea_exp.report.__main__, andrea_exp.report.figures; "
            "print(sorted(m for m in ('torch', 'hydra', 'scipy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_every_figure_a_worker_draws_lives_in_a_module_that_loads_no_torch():
    """A worker imports the module of each figure function it is handed: one that pulled in torch (through the
    claims' static numbers) cost every worker a second of start-up and the report a third of its time."""
    modules = {fn.__module__ for name, mod in list(sys.modules.items()) if name.startswith("andrea_exp.report")
               for _, fn in inspect.getmembers(mod, inspect.isfunction) if getattr(fn, "drawn_in_worker", False)}
    assert "andrea_exp.report.figures" in modules
    code = (f"import sys; import {', '.join(sorted(modules))}; "
            "print(sorted(m for m in ('torch', 'hydra', 'scipy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", sorted(modules)


def test_static_numbers_are_computed_once_and_each_caller_gets_its_own_copy():
    static.pipeline_checks.cache_clear()
    first = static.pipeline_checks(T=8, d_k=4)
    second = static.pipeline_checks(T=8, d_k=4)
    info = static.pipeline_checks.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    assert first == second and first is not second
    first["row_sum_max_dev"] = "changed by a caller"
    assert static.pipeline_checks(T=8, d_k=4)["row_sum_max_dev"] != "changed by a caller"


def test_an_unhashable_argument_is_computed_afresh():
    rows = static.dot_product_std([64], n_pairs=100)
    assert [r["d_k"] for r in rows] == [64] and rows == static.dot_product_std((64,), n_pairs=100)
