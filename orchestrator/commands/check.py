"""`moe-autotune check [STUDY]`: the Optuna study and its MLflow experiment, compared trial by trial;
`moe-autotune confirm [STUDY] --top K`: the best proxy-measured layouts run again at full size."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from search_spaces.errors import SpecError

from orchestrator.commands import store_options
from orchestrator.spec.schema import DEFAULT_STORAGE


def register(app: typer.Typer) -> None:
    app.command("check")(check)
    app.command("confirm")(confirm)


def check(
    study_name: Optional[str] = typer.Argument(None, metavar="[STUDY]", help="default: the last study"),
    storage: str = typer.Option(DEFAULT_STORAGE, help="Optuna storage URL"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", callback=store_options.tracking_uri,
                                               help="MLflow tracking URI (default: the one the study recorded)"),
    salvage: Optional[Path] = typer.Option(None, "--salvage", metavar="NEW.journal",
                                           help="A damaged journal storage: write what is intact (every study, the "
                                                "damaged lines named) to this new journal file, and check nothing "
                                                "else."),
) -> int:
    """Verify that nothing was lost, doubled or mixed: exit 0 when the study and MLflow agree, 1 otherwise.

    During a live sweep, the trials its driver is still running or recording are shown as in flight, not as
    differences."""
    from search_spaces.inputs import check_optional_name

    from orchestrator.redact import redact_uri
    from orchestrator.userio import echo

    check_optional_name(study_name, "study name")
    if salvage is not None:
        if study_name is not None or tracking_uri is not None:
            raise SpecError("--salvage writes every study of the journal to a new one: give no STUDY or "
                            "--tracking-uri (check a study in the new journal afterwards)")
        return _salvage(storage, salvage)
    from orchestrator.outputs.check import examine  # Optuna and MLflow: for a name that passed
    verdict = examine(storage, study_name, tracking_uri, live=_driven)
    study, problems = verdict.study, verdict.problems
    finished = sum(1 for t in study.trials if t.state.is_finished())
    for problem in problems:
        echo(f"differs: {redact_uri(problem)}")
    said = "consistent" if not problems else f"{len(problems)} difference(s)"
    if verdict.in_flight:
        shown = ", ".join(map(str, verdict.in_flight[:10])) + (", ..." if len(verdict.in_flight) > 10 else "")
        said += f"; in flight ({len(verdict.in_flight)}): trials {shown}, run by {verdict.driver}"
    echo(f"study {study.study_name}: {finished} finished trials; {said}")
    return 1 if problems else 0


def _salvage(storage: str, out: Path) -> int:
    """`check --salvage`: the intact part of a damaged journal written to `out`, what was lost named line by line."""
    from search_spaces.inputs import check_output_file

    from orchestrator.storage import journal, journal_salvage
    from orchestrator.userio import echo

    source = journal.check_url(storage)
    journal.require_journal(source, "Optuna storage", storage, "")
    check_output_file(out, "--salvage")
    if out.exists() or out.resolve() == source.resolve():
        raise SpecError(f"--salvage {str(out)!r} exists; name a new file (the damaged journal is never changed)")
    found = journal_salvage.salvage(source)
    journal_salvage.write(found, out)
    for damage in found.damage:
        echo(str(damage))
    if found.torn_tail:
        echo("its last line is torn (an append cut short, never read by anyone): left out")
    damaged, url = found.damaged_studies, f"journal:///{out}"
    whole = [s for s in found.studies if s not in damaged]
    if any(d.study is None for d in found.damage):  # a lost line whose study cannot be read: none is known whole
        said = (f"{len(found.studies)} studies ({', '.join(found.studies) or 'none'}); {len(found.damage)} damaged "
                f"line(s), not every one's study can be read: check each study with moe-autotune check STUDY "
                f"--storage {url}")
    elif damaged:
        said = (f"{len(whole)} studies whole ({', '.join(whole) or 'none'}); {', '.join(damaged)} without "
                f"{len(found.damage)} damaged line(s): check each with moe-autotune check STUDY --storage {url}")
    else:
        said = f"{len(whole)} studies whole ({', '.join(whole) or 'none'}); use it with --storage {url}"
    echo(f"salvaged {str(source)!r} into {str(out)!r}: {said}")
    return 0


def _driven(study) -> str | None:
    """The live driver, other than this process, that holds the study's lease (a sweep or confirm running now), as
    the lease names it; None when there is none. On this host its process answers; a holder on another host is
    taken to be alive while its lease is held (a dead one's lease is taken over by the next --resume)."""
    import os

    from orchestrator.sweep.lease import Holder

    holder = Holder.of(study)
    if holder is None or (holder.here and (holder.pid == os.getpid() or not holder.process_alive)):
        return None
    return str(holder)


def confirm(
    study_name: Optional[str] = typer.Argument(None, metavar="[STUDY]", help="default: the last study"),
    top: int = typer.Option(3, "--top", min=1, help="how many of the best proxy-measured layouts to confirm"),
    storage: str = typer.Option(DEFAULT_STORAGE, help="Optuna storage URL"),
    trial_gpus: Optional[int] = typer.Option(None, "--trial-gpus", help="GPUs one trial may use now "
                                                                        "(at least the layout's full size)"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", callback=store_options.tracking_uri),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="join a running Ray cluster"),
    quiet: bool = typer.Option(False, "--quiet", help="no live progress"),
) -> int:
    """Run the best proxy-measured layouts at full size, as trials of the same study (before promote)."""
    from rich.table import Table

    from search_spaces.inputs import check_optional_name

    from orchestrator.userio import console

    check_optional_name(study_name, "study name")
    from orchestrator.records import TrialRecord  # Optuna, Ray, MLflow: for a name that passed
    from orchestrator.sweep.confirm import confirm as run_confirm
    done, outcome = run_confirm(storage, study_name, top, {"trial_gpus": trial_gpus, "tracking_uri": tracking_uri,
                                                            "ray_address": ray_address, "show_progress": not quiet})
    table = Table(title="composed from the proxy vs measured at full size (tokens/s/GPU)")
    for col in ("layout", "proxy trial", "composed", "full trial", "measured", "error"):
        table.add_column(col)
    for c in done:
        full = c.full
        table.add_row(TrialRecord.of(c.proxy).layout_key or "", str(c.proxy.number), f"{c.proxy.values[0]:,.1f}",
                      str(full.number) if full else "-", f"{full.values[0]:,.1f}" if full and c.error is not None
                      else ((TrialRecord.of(full).status or "-") if full else "-"),
                      f"{c.error:+.1%}" if c.error is not None else "-")
    console().print(table)
    return outcome.exit_code
