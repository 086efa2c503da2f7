"""The documentation (issue 32): reference pages derived from the code, never copied; the README a short guide.

docs/refgen.py's pure functions are called directly: the CLI page must hold every command and flag of the Typer
app's click tree (and one added to a copy of the app appears), the spec, rules, dimensions and catalog pages every
field, rule, model and GPU. The strict `mkdocs build` (what CI runs) is the last test (a few seconds).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[2]
README_MAX_WORDS = 1500


def _load_refgen():
    spec = importlib.util.spec_from_file_location("refgen", ROOT / "docs" / "refgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


refgen = _load_refgen()


def _click_tree(app) -> list[tuple[tuple[str, ...], object]]:
    return refgen.walk_commands(typer.main.get_command(app))


def _assert_lists_every_command_and_flag(app, text: str) -> int:
    seen = 0
    for path, command in _click_tree(app):
        name = " ".join(("moe-autotune", *path))
        if path:
            assert f"## {name}\n" in text, f"no section for `{name}`"
        section = text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0] if path else text
        for param in command.params:
            if param.name == "help":
                continue
            if param.param_type_name == "option":
                for flag in refgen.flags(param):
                    assert f"`{flag}`" in section, f"`{name}` lacks {flag}"
                    seen += 1
            else:
                assert refgen.code(refgen.argument_name(param)) in section, f"`{name}` lacks argument {param.name}"
    return seen


# ---- (a) every command and flag of the CLI ---------------------------------------------------------------------

def test_the_cli_page_lists_every_command_and_every_flag():
    from orchestrator.commands.cli import app

    text = refgen.cli_reference()
    flags_seen = _assert_lists_every_command_and_flag(app, text)
    commands = {p[-1] for p, _ in _click_tree(app) if p}
    assert {"estimate", "space", "sweep", "status", "promote", "export", "report", "calibrate", "slurm",
            "render", "submit"} <= commands
    assert flags_seen > 100 and "`--debug`" in text  # the app's own option, on the root section


# ---- (b) derived, not copied: a flag added to the app appears ----------------------------------------------------

def test_a_flag_added_to_the_app_appears_in_the_page():
    from orchestrator.commands.cli import app

    extended = copy.copy(app)
    extended.registered_commands = list(app.registered_commands)
    extended.registered_groups = list(app.registered_groups)

    @extended.command("nonesuch", help="A command only this test registers.")
    def nonesuch(depth: int = typer.Option(3, "--frobnicate-depth", help="How deep to frobnicate."),
                 target: str = typer.Argument(..., help="What to frobnicate.")) -> None:
        """A command only this test registers."""

    before, after = refgen.cli_reference(app), refgen.cli_reference(extended)
    assert "--frobnicate-depth" not in before and "nonesuch" not in before
    section = after.split("## moe-autotune nonesuch\n", 1)[1]
    assert "`--frobnicate-depth`" in section and "How deep to frobnicate." in section and "`3`" in section
    assert "`TARGET`" in section
    _assert_lists_every_command_and_flag(extended, after)
    assert "nonesuch" not in refgen.cli_reference(app)  # the real app was not touched


def test_a_small_app_registered_the_same_way_is_walked_the_same_way():
    small = typer.Typer(name="small")

    @small.callback()
    def _root() -> None:
        """Root."""

    def go(fast: bool = typer.Option(False, "--fast", help="Go fast.")) -> None:
        """Go somewhere."""

    def register(app: typer.Typer) -> None:  # as orchestrator/commands/*.py register theirs
        app.command("go")(go)

    register(small)
    group = typer.Typer(help="A group.")
    group.command("deep", help="Deep.")(lambda: None)
    small.add_typer(group, name="grp")
    text = refgen.cli_reference(small, program="moe-autotune")
    assert "## moe-autotune go\n" in text and "`--fast`" in text and "Go fast." in text
    assert "## moe-autotune grp deep\n" in text


# ---- (c) spec fields, rules, dimensions, models and GPUs --------------------------------------------------------

def test_the_spec_page_lists_every_field_with_its_doc():
    text = refgen.spec_reference()
    fields = refgen.spec_fields()
    assert {"name", "budget.n_trials", "cost.train_tokens", "packing.lengths", "free", "fixed"} <= {
        n for n, _, _ in fields}
    for name, info, _ in fields:
        assert f"| `{name}` |" in text, name
        assert info.description, f"spec field {name} has no docstring"
        assert refgen.cell(info.description) in text, name


def test_the_rules_page_lists_every_rule_with_its_reason():
    from search_spaces import RULE_REGISTRY

    text = refgen.rules_reference()
    assert len(RULE_REGISTRY) > 20
    for rule in RULE_REGISTRY:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{rule.name}` |"))
        assert refgen.cell(rule.why) in row, rule.name


def test_the_failures_page_lists_every_failure_class_with_its_meaning():
    from search_spaces.failures import FAILURE_CLASSES

    text = refgen.failures_reference()
    for failure in FAILURE_CLASSES:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{failure.name}` |"))
        assert refgen.cell(failure.meaning) in row, failure.name


def test_the_dimensions_page_lists_every_dimension_with_its_values_and_doc():
    from search_spaces import Layout, dimensions_of

    text = refgen.dimensions_reference()
    for dim in dimensions_of(Layout):
        row = next(line for line in text.splitlines() if line.startswith(f"| `{dim.name}` |"))
        assert refgen.cell(dim.doc) in row and f"`{dim.flag}`" in row, dim.name
        for choice in dim.choices:
            assert f"`{choice}`" in row, (dim.name, choice)


def test_the_catalog_pages_list_every_model_and_gpu():
    from search_spaces import GPUS, MODEL_NAMES

    models, gpus = refgen.models_reference(), refgen.gpus_reference()
    for name in MODEL_NAMES:
        assert f"| `{name}` |" in models, name
    for name, gpu in GPUS.items():
        assert f"| `{name}` |" in gpus, name
        assert f"{gpu.memory_gib:g}" in gpus


def test_the_accuracy_page_is_the_benchmarks_figures():
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    text = refgen.accuracy_reference(results)
    est = results["estimator_accuracy"]["result"]
    for half in est["mape"].values():
        assert f"{half['mape']:.1f}%" in text
    for fold in est["leave_one_out"]["folds"]:
        assert refgen.cell(fold["name"]) in text
    # derived: other figures, another page
    est["mape"]["held out <=8K"]["mape"] = 77.7
    assert "77.7%" in refgen.accuracy_reference(results)


def test_every_cost_module_has_a_page():
    import search_spaces.cost as cost

    pages = refgen.cost_parts()
    for module in refgen.cost_modules():
        assert f"cost-model/parts/{module}.md" in pages
        assert f"::: search_spaces.cost.{module}" in pages[f"cost-model/parts/{module}.md"]
        assert importlib.import_module(f"search_spaces.cost.{module}").__doc__, f"{module} has no docstring"
    assert len(pages) == len(list(Path(cost.__path__[0]).glob("[!_]*.py"))) + 1


def test_every_generated_page_is_in_the_nav_or_the_cost_parts():
    nav = (ROOT / "mkdocs.yml").read_text()
    for path in refgen.pages():
        assert path in nav or path.startswith("cost-model/parts/"), path


# ---- (d) the README is a guide ----------------------------------------------------------------------------------

def test_the_readme_is_at_most_1500_words_and_links_the_docs():
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= README_MAX_WORDS, len(text.split())  # `wc -w`'s count
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).is_file(), target


# ---- (e) the site builds with warnings as errors ----------------------------------------------------------------

def _mkdocs() -> str | None:
    here = Path(sys.executable).parent / "mkdocs"
    return str(here) if here.exists() else shutil.which("mkdocs")


@pytest.mark.timeout(300)  # ~4 s here: in the fast lane too
@pytest.mark.skipif(_mkdocs() is None, reason="mkdocs is not installed (scripts/setup.sh installs the docs extra)")
def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run([_mkdocs(), "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    site = tmp_path / "site"
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "--calibration" in cli and "moe-autotune sweep" in cli
    assert "bench/estimator_accuracy.py" in (site / "benchmarks" / "index.html").read_text()  # RESULTS.md included


def test_the_pipeline_drawing_puts_each_virtual_stage_on_its_rank_and_chunk():
    """Virtual stage s runs on rank s mod PP as chunk s div PP (Megatron's interleaved schedule)."""
    text = refgen.pipeline_drawing("Et|tt|t|tm|L|t", pp=3, vpp=2)
    rows = {line.split(" | ")[0].strip("| "): [c.strip(" |`") for c in line.split(" | ")[1:]]
            for line in text.splitlines()[2:]}
    assert rows == {"0": ["E t", "t m"], "1": ["t t", "L"], "2": ["t", "t"]}


def test_the_worked_example_is_the_cost_models_own_estimate():
    from search_spaces import Layout, estimate
    from search_spaces.cost.breakdown import PEAK_KEYS

    ex = refgen.EXAMPLE
    est = estimate(ex["model"], ex["gpu"], ex["num_gpus"], ex["seq_len"], Layout.from_dict(ex["layout"]))
    text = refgen.example_reference()
    assert f"{est.tokens_per_sec_per_gpu:,.1f}" in text and f"`{est.pipeline_layout}`" in text
    shown = {m.group(1): float(m.group(2).replace(",", ""))
             for m in re.finditer(r"^\| `(\w+)` \| ([\d,.]+) \|", text.split("## Time per step")[0], re.M)}
    assert set(shown) <= set(PEAK_KEYS) and sum(shown.values()) == pytest.approx(est.peak_memory_gib, abs=0.01)


# ---- (f) the tour's screenshots are the product's own, redrawn by docs/make_figures.py --------------------------

def _load_make_figures():
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "docs" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _images_shown(page: Path) -> set[str]:
    return set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text()))


def test_every_image_a_page_shows_is_in_the_docs():
    pages = list((ROOT / "docs").rglob("*.md"))
    shown = {(page.parent / src).resolve() for page in pages for src in _images_shown(page)}
    assert shown, "no page shows a figure"
    assert [str(p) for p in shown if not p.is_file()] == []


def test_the_tour_shows_exactly_the_figures_the_script_makes():
    from orchestrator.outputs.report import FIGURES as REPORT_FIGURES

    make_figures = _load_make_figures()
    assert set(make_figures.REPORT_FIGURES) <= set(REPORT_FIGURES)  # the report still draws each one
    shown = _images_shown(ROOT / "docs" / "tour.md")
    assert shown == {f"figures/{name}.png" for name in make_figures.FIGURES}
    committed = {p.name for p in (ROOT / "docs" / "figures").glob("*.png")}
    assert committed == {f"{name}.png" for name in make_figures.FIGURES}  # nothing stale beside them


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("chromium") is None and not os.environ.get("BROWSER_PATH"),
                    reason="the figures are Chromium screenshots")
def test_make_figures_draws_every_figure_from_a_real_sweep(tmp_path):
    """The real thing: an analytic sweep, its report, the MLflow UI photographed; each PNG a real image."""
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "make_figures.py"), "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=880)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in _load_make_figures().FIGURES:
        data = (tmp_path / f"{name}.png").read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, name  # a drawing, not an empty page
