"""Credentials given to `moe-autotune slurm render|submit` reach the job by reference, never in its batch script
(issue 58, item 4): Slurm keeps a copy of every script it is given (`scontrol write batch_script`, `sacct
--batch-script`), `render` prints it, and the script sits in the shared folder for anyone who can read it.

A value carries a credential when the redaction rules would change it (orchestrator/redact.py: a URL's user-info
or secret query values, a libpq `password=`, an authorization header, a token's shape, ...; an --env variable also
when its name is a secret's, `HF_TOKEN`, `DB_PASSWORD`). What is done with it depends on where it would go:

- `--storage`, `--tracking-uri` (the sweep's stores): left out of the driver's command line; exported as
  MOE_AUTOTUNE_STORAGE / MOE_AUTOTUNE_TRACKING_URI, which the job's `moe-autotune sweep` and `slurm link-run` read
  when the flag is not given (orchestrator/commands/store_options.py);
- an `--env KEY=VALUE` (or a site file's `env:`): left out of the script's exports, exported under its own name;
- anything else the script would hold (an #SBATCH value, which sbatch reads before the job starts; the workdir,
  venv, container image or mounts, the spec's path): refused, one line naming the setting with its value masked,
  exit 2, before anything is written.

What is kept out goes to one file beside the job's scripts, `WORKDIR/runs/slurm/<job>-<time>-<pid>.credentials`,
created readable by its owner only (mode 600) and written whole; the script exports MOE_AUTOTUNE_CREDENTIALS (its
path) and sources it before anything runs. The job runs as the user who rendered it, on the shared folder, so it
reads the file; nobody else does. A submission sbatch refuses takes its file away with its script.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces.errors import SpecError

from orchestrator.commands.store_options import STORAGE_ENV, TRACKING_URI_ENV
from orchestrator.errors import OutputError
from orchestrator.redact import redact_mapping, redact_text

CREDENTIALS_ENV = "MOE_AUTOTUNE_CREDENTIALS"  # the script's export naming the file it sources
# the sweep options that can carry a credential, and the variable the job's commands read each from
BY_REFERENCE = {"storage": (STORAGE_ENV, "--storage"), "tracking_uri": (TRACKING_URI_ENV, "--tracking-uri")}
SUFFIX = ".credentials"


_PASS_INSTEAD = ("pass credentials in --storage, --tracking-uri or --env (they reach the job through a file "
                 "readable by you only)")
_WHERE_INSTEAD = {"container_image": "give the registry's credentials to enroot instead "
                                     "(~/.config/enroot/.credentials), and the image as [USER@][REGISTRY#]IMAGE[:TAG]"}


def carries(value: Any) -> bool:
    """Is a credential's shape in this value (would the redaction rules mask part of it)?"""
    return isinstance(value, str) and redact_text(value) != value


@dataclass
class Kept:
    """The credentials kept out of a batch script: the variables its file exports, and what each was (masked)."""

    values: dict[str, str] = field(default_factory=dict)
    shown: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.values)

    def text(self) -> str:
        lines = ["# moe-autotune slurm: the credentials given to `moe-autotune slurm render|submit`, kept out of the",
                 "# batch script, which sources this file (readable by you only). Delete it once the job is done.",
                 *(f"export {name}={shlex.quote(value)}" for name, value in self.values.items())]
        return "\n".join(lines) + "\n"

    def write(self, folder: Path, job_name: str) -> Path:
        """The file, created with mode 600 (never readable by others, not even while it is written), whole or not
        at all; an OSError is one OutputError line (exit 6)."""
        path = folder / f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}{SUFFIX}"
        made = False
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            made = True
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fh.fileno(), 0o600)  # whatever the umask
                fh.write(self.text())
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            if made:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise OutputError(f"cannot write the credentials file {str(path)!r}: {exc.strerror or exc}") from None
        return path

    def note(self, path: Path) -> str:
        """One line for stderr: what was kept out (masked) and where the job reads it."""
        return (f"note: {', '.join(self.shown)} kept out of the batch script: the job reads "
                f"{'it' if len(self.shown) == 1 else 'them'} from {path} (readable by you only)")


def keep_out(sweep_options: dict[str, Any], env: dict[str, str]) -> tuple[dict[str, Any], dict[str, str], Kept]:
    """The sweep options and job environment without their credentials, and the credentials (Kept)."""
    kept = Kept()
    options = dict(sweep_options)
    for option, (name, flag) in BY_REFERENCE.items():
        if carries(options.get(option)):
            kept.values[name] = options.pop(option)
            kept.shown.append(f"{flag} {redact_text(kept.values[name])}")
    plain = {}
    for key, value in env.items():
        if carries(value) or redact_mapping({key: value}) != {key: value}:  # a secret's shape, or a secret's name
            kept.values[key] = value
            kept.shown.append(f"--env {key}")
        else:
            plain[key] = value
    return options, plain, kept


def refuse_the_rest(settings: dict[str, Any], argv: list[str]) -> None:
    """Every other value the script would hold: one SpecError line for the first that carries a credential."""
    for name, value in settings.items():
        if name == "env":
            continue
        for item in value if isinstance(value, list) else [value]:
            if carries(item):
                raise SpecError(f"slurm setting {name} carries a credential ({redact_text(item)!r}): it would be "
                                "written into the batch script, which Slurm keeps a copy of; "
                                + _WHERE_INSTEAD.get(name, _PASS_INSTEAD))
    for arg in argv:
        if carries(arg):
            raise SpecError(f"{redact_text(arg)!r} looks like a credential and would be written into the batch "
                            f"script: rename it; {_PASS_INSTEAD}")


def refuse_in_env_names(pairs: list[str] | None) -> None:
    """An --env item whose name (or the whole item, without '=') carries a credential: one line, masked, before
    the item is parsed (a value that does is kept out, by keep_out)."""
    for pair in pairs or []:
        key, sep, _ = pair.partition("=")
        if carries(key if sep else pair):
            raise SpecError(f"--env {redact_text(pair)!r}: expected KEY=VALUE, KEY a variable's name (the value "
                            "may hold a credential: it reaches the job through a file readable by you only)")
