"""Runs what the write-behind tests need in a process of its own: a single-threaded one, where a writer can be
forked (a pytest-xdist worker has a second thread, so no writer is ever forked there).

    python -m tests.write_behind_driver sweep SPEC_JSON MODE   # an in-process sweep; prints {"exit_code", "writers"}
    python -m tests.write_behind_driver echo COUNT SIZE [DIE]  # a writer echoing COUNT requests of SIZE bytes
                                                               # (dying as it reads request DIE)
    python -m tests.write_behind_driver orphan                 # prints a writer's pid, then this process dies

The sweep's MODEs (each a fault the sweep must absorb without losing or doubling a record):
    plain          the writer makes every record
    dies           the writer dies right after making its third record, before answering it
    quiet-over     the lease's quiet time is over for every record: the writer hands each one back untouched
    half-made      the writer's fence passes a record's first write and refuses its second: each comes back
                   half made (its figures logged, its run not closed)
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _sweep(spec_json: str, mode: str) -> None:
    from orchestrator.errors import LeaseLost
    from orchestrator.search.prior import Prior
    from orchestrator.spec.schema import parse_spec
    from orchestrator.sweep import run_sweep
    from orchestrator.sweep.lease import Lease
    from orchestrator.tracking import tracker as tracking
    from orchestrator.tracking import write_behind as behind_module

    started: list[bool] = []
    write_behind = tracking.Tracker.write_behind

    def counted(self, quiet_until):
        started.append(write_behind(self, quiet_until))
        return started[-1]

    tracking.Tracker.write_behind = counted  # type: ignore[method-assign]
    if mode == "dies":
        serve = tracking.Tracker._write_behind
        made: list[int] = []

        def dying(self, request):
            answer = serve(self, request)
            made.append(1)
            if len(made) == 3:
                os._exit(9)
            return answer

        tracking.Tracker._write_behind = dying  # type: ignore[method-assign]
    elif mode == "quiet-over":
        Lease.quiet_until = lambda self: 0.0  # type: ignore[method-assign]
    elif mode == "half-made":
        calls: list[int] = []

        def every_second_write(deadline: float) -> None:
            calls.append(1)
            if len(calls) % 2 == 0:
                raise LeaseLost("the quiet time ran out between two writes")

        behind_module._before = every_second_write  # the writer's fence (WriteBehind._write_behind)
    spec = parse_spec(json.loads(spec_json))
    outcome = run_sweep(spec, prior=Prior(spec), show_progress=False)
    print(json.dumps({"exit_code": outcome.exit_code, "writers": started}))


def _echo(count: int, size: int, die: int | None) -> None:
    from orchestrator.tracking.writer_process import WriterProcess

    def serve(request):
        if request[0] == die:
            os._exit(3)
        return request[0], b"a" * size

    writer = WriterProcess.start(serve)
    assert writer is not None, "no writer forked"
    early = []
    for i in range(count):
        early += writer.send((i, b"r" * size))
    late = writer.close()
    numbers = [request[0] for request, _ in early + late]
    ok = all(request[0] == answer[0] and len(answer[1]) == size for request, answer in early + late)
    print(json.dumps({"numbers": numbers, "answers_match": ok, "alive": writer.alive,
                      "unanswered": [request[0] for request in writer.unanswered]}))


def _orphan() -> None:
    from orchestrator.tracking.writer_process import WriterProcess

    writer = WriterProcess.start(lambda request: request)
    assert writer is not None, "no writer forked"
    print(writer.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "sweep":
        _sweep(args[0], args[1])
    elif command == "echo":
        _echo(int(args[0]), int(args[1]), int(args[2]) if len(args) > 2 else None)
    else:
        _orphan()
