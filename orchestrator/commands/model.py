"""`moe-autotune model CONFIG`: how a model's config.json (or a catalog model) was read: its decoder layers by
kind in compressed form, experts, top-k, shared experts, total and active parameters, the fields ignored and
what the cost model approximates (search_spaces/catalog/reading.py). A config is refused in one line (exit 2)
where it holds a field the reader does not know or a cost-changing field it does not model."""

from __future__ import annotations

import typer

MODEL_HELP = ("a catalog name (as `estimate --model`) or the path of a Hugging Face config.json (or its folder). "
              "Read: DeepSeek-V2/V3 and Kimi-K2, GLM-4.5, Qwen2/3-MoE and Qwen3-Next, Llama(-4, its text_config), "
              "Mixtral/Mistral, gpt-oss and ERNIE-4.5-MoE fields")


def register(app: typer.Typer) -> None:
    app.command("model")(model)


def model(
    config: str = typer.Argument(..., help=MODEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> int:
    """Show how a model's config was read: layers by kind, experts, top-k, shared experts, total and active
    parameters, the fields ignored (and why) and what the estimate approximates."""
    from search_spaces.catalog.models import load_model
    from search_spaces.catalog.reading import describe

    from orchestrator.userio import echo, json_line

    d = describe(load_model(config))
    if as_json:
        echo(json_line(d, "model --json"))
        return 0
    print_reading(d)
    return 0


def config_reading(model: str, spec) -> dict | None:
    """The reading of `spec` (search_spaces.catalog.reading.describe) where `model`, the --model of `estimate` or
    `space`, is the path of a config.json (or its folder), not a catalog name: what those commands print above
    their tables and put under "model_reading" in their --json. None for a catalog name."""
    from search_spaces.catalog.reading import config_reading as reading

    return reading(model, spec)


def print_reading(d: dict) -> None:
    """A reading's lines (reading_lines) on the console, as `model` prints them."""
    from orchestrator.userio import console

    out = console()
    for line in reading_lines(d):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def reading_lines(d: dict) -> list[str]:
    """The lines `model` prints of a reading (search_spaces.catalog.reading.reading_lines); the docs' model-reading
    page and a sweep's MLflow parent run show the same."""
    from search_spaces.catalog.reading import reading_lines as lines

    return lines(d)
