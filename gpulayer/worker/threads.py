"""How many threads a job's numeric libraries start: one per CPU slot the job holds, not one per
core of the machine. Left alone, OpenBLAS, MKL and OpenMP each start a thread per core in every job,
and two one-slot jobs on a two-core worker run four busy threads on two cores (a scikit-learn sweep
with ``.map`` ran 3.5-4x slower than a plain loop). Ray sets ``OMP_NUM_THREADS`` for its tasks the
same way. A job that sets one of these variables in its own ``env`` keeps its value.
"""

from __future__ import annotations

from ..models import JobSpec

#: Where numeric libraries read their thread count: OpenMP's (PyTorch, scikit-learn, most BLAS
#: builds), Intel MKL, OpenBLAS, numexpr, Apple Accelerate, BLIS, and Rust's rayon (tokenizers,
#: polars).
VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
    "RAYON_NUM_THREADS",
)


def thread_variables(spec: JobSpec) -> dict[str, str]:
    """Each of :data:`VARIABLES` as the job's processes get it: its own ``env``'s value, else its
    CPU slots (at least one: a GPU job holds none by default; a gang job's node shares its slots
    among its ranks there)."""
    cpus = spec.requirements.cpus
    if spec.distributed is not None:
        cpus //= spec.distributed.procs_per_node
    count = str(max(cpus, 1))
    return {name: spec.env.get(name, count) for name in VARIABLES}
