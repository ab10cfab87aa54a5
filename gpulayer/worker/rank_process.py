"""One rank of a gang job that calls a remote function:
``python -m gpulayer.worker.rank_process CALL FOLDER``.

The worker starts it as it starts any rank (with torchrun's environment, or through torchrun), in
the code bundle's folder. It runs the call as an executor does (:func:`executor_process.run`); rank 0
writes what it returned, and a rank whose call raised writes its exception, to
``FOLDER/<rank>.result`` (a JSON header line, then the pickle), for the worker to sign and store as
the job's result. It exits 1 if the call raised, and without the interpreter's teardown.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .executor_process import run
from .node_ranks import RESULT_SUFFIX


def main(argv: list[str]) -> None:
    # The project (the bundle, this process's folder) imports first, as it does where it was written.
    sys.path.insert(0, os.getcwd())
    reply, blob = run({"env": {}}, Path(argv[1]).read_bytes())
    rank = os.environ.get("RANK", "0")
    if rank == "0" or not reply["ok"]:
        Path(argv[2], rank + RESULT_SUFFIX).write_bytes(json.dumps(reply).encode() + b"\n" + blob)
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is written: skip the interpreter's teardown, where threads a call left behind
    # (gloo's, after destroy_process_group) now and then abort the process and fail a finished rank.
    os._exit(0 if reply["ok"] else 1)


if __name__ == "__main__":
    main(sys.argv)
