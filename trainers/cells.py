"""Several trials in one set of processes: `torchrun --nproc-per-node N -m trainers.cells CELLS.json`.

CELLS.json is a list of `{"name": ..., "argv": [...]}`; each argv is a whole `trainers.megatron_moe` command line
(its own model, layout flags and `--result`), run by the same `main` a trial runs, one after another on the same
N ranks. Between trials Megatron-Core's parallel state is torn down and built again for the next layout; the
process group, the imports and the CPU patches stay. What this saves is the start-up of every rank (about 5 s of
CPU a rank on CPU): the layout-coverage tests run dozens of layouts this way (tests/trainers/test_layout_matrix.py).

A result written here says `extra.shared_process`: its peak memory (the process's resident set on CPU) and wall
time include the trials before it, so it is not a memory or start-up measurement. The first trial that fails ends
the run (its result says why; a collective that failed may leave the group unusable): later cells have no result.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any


def read_cells(path: str) -> list[dict]:
    cells = json.loads(Path(path).read_text())
    if not isinstance(cells, list) or not all(isinstance(c, dict) and isinstance(c.get("argv"), list)
                                              for c in cells):
        raise ValueError(f"{path}: expected a list of {{'name': ..., 'argv': [...]}}")
    return cells


def share_process_groups() -> None:
    """One process group per set of ranks for the whole run: every layout asks for groups over the same few rank
    sets, and a group Megatron-Core made for one layout serves the next as well. Without this each layout left
    about twenty groups behind (Megatron forgets them at teardown, and something of the last model keeps them
    alive): two thousand gloo threads a rank after fifty layouts, which starved the machine. `torch.distributed`'s
    new_group hands back the group already made for the same ranks and options; destroy_process_group leaves
    those alone (Megatron's teardown destroys its gloo groups) until the whole group is destroyed at the end."""
    import torch.distributed as dist

    made: dict[tuple, Any] = {}
    new_group, destroy = dist.new_group, dist.destroy_process_group

    def shared_new_group(ranks=None, timeout=None, backend=None, pg_options=None, **options):
        key = (tuple(sorted(ranks)) if ranks is not None else None, str(backend), timeout, repr(pg_options),
               options.get("use_local_synchronization", False))
        if key not in made:  # every rank makes the same calls in the same order: a collective stays collective
            made[key] = new_group(ranks=ranks, timeout=timeout, backend=backend, pg_options=pg_options, **options)
        return made[key]

    def shared_destroy(group=None):
        if group is None or all(group is not g for g in made.values()):
            destroy(group)

    # (torch's own signatures name each option; these pass every one through)
    dist.new_group, dist.destroy_process_group = shared_new_group, shared_destroy  # type: ignore[assignment]


def reset_between_trials() -> None:
    """Megatron-Core's global parallel state and the last trial's objects, before the next layout is built."""
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker

    parallel_state.destroy_model_parallel()
    # its per-layer MoE metrics (the load-balancing loss) are sized by the first model that records them: a later
    # model with more MoE layers would index past them
    destroy_moe_metrics_tracker()
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m trainers.cells CELLS.json", file=sys.stderr)
        return 2
    from trainers import megatron_moe

    rank = int(os.environ.get("RANK", "0"))
    share_process_groups()
    for cell in read_cells(argv[0]):
        try:
            code = megatron_moe.main([str(a) for a in cell["argv"]], shared=True)
        except BaseException:  # noqa: BLE001 -- its result is written; peers must not wait on this rank
            print(f"rank {rank}: cell {cell.get('name')} failed:\n{traceback.format_exc()[-3000:]}",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)
        if code != 0:  # refused before any process group work (bad flags): the same on every rank
            return code
        reset_between_trials()
    megatron_moe._finish()
    return 0


if __name__ == "__main__":
    from search_spaces.ownership import die_with_launcher

    die_with_launcher()  # a rank dies with its torchrun (which starts it in a session of its own)
    sys.exit(main())
