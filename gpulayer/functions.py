"""``@gl.remote``: a Python function that runs on a worker with what it asks for, its result (or its
exception) back in the caller.

    import gpulayer as gl

    @gl.remote(gpus=1, gpu_memory="24GB", frameworks={"torch": ">=2.1"})
    def train(lr: float) -> float: ...

    train(0.1)                          # runs here, unchanged
    train.remote(0.1).result()          # runs on a worker
    list(train.map([0.1, 0.01]))        # one job per item, results in order
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from typing_extensions import Unpack

from .calls import Call
from .client import Client
from .errors import InvalidJobSpec
from .job import Job
from .models import JobRecord, LogLine, validated
from .options import CallKeywords, CallOptions
from .requirements import Requirements

P = ParamSpec("P")
R = TypeVar("R")
_default: Client | None = None
#: What a call may ask of the machine it runs on: the fields of :class:`gpulayer.Requirements`.
_REQUIREMENTS = frozenset(Requirements.model_fields)
_OPTIONS = frozenset(CallOptions.model_fields) - {"requirements"}


def connect(redis_url: str | None = None, **kwargs: Any) -> Client:
    """Set the client remote functions use unless given another: ``redis_url``, else
    ``GPULAYER_REDIS_URL``, else the Redis that `gpulayer up` runs here. Nothing connects at import,
    nor here: the first call does."""
    global _default  # noqa: PLW0603 - one default client per process, as logging has one root logger
    if _default is not None:
        _default.close()
    _default = Client(redis_url, **kwargs)
    return _default


def default_client() -> Client:
    return _default if _default is not None else connect()


def _options(base: CallOptions, changes: dict[str, Any]) -> tuple[CallOptions, Client | None]:
    """``base`` with ``changes`` (requirements and options by name, as ``remote`` takes them)."""
    client = changes.pop("client", None)
    unknown = set(changes) - _REQUIREMENTS - _OPTIONS
    if unknown:
        raise InvalidJobSpec(f"unknown option(s) for a remote function: {', '.join(sorted(unknown))}")
    requirements = {
        **base.requirements,
        **{key: value for key, value in changes.items() if key in _REQUIREMENTS},
    }
    validated(Requirements, requirements)
    options = {key: value for key, value in changes.items() if key in _OPTIONS}
    return validated(CallOptions, {**dict(base), **options, "requirements": requirements}), client


class FunctionHandle(Generic[R]):
    """A call of a remote function: a job. ``result()`` waits for its value."""

    def __init__(self, job: Job, allow_pickle: bool | None = None) -> None:
        self.job = job
        self.id = job.id
        self._allow_pickle = allow_pickle

    def __repr__(self) -> str:
        return f"FunctionHandle({self.id!r})"

    def result(self, timeout: float | None = None) -> R:
        """Its return value; or the exception it raised, raised here; or :class:`JobFailed` (worker
        lost, timed out, cancelled) when it ended another way."""
        value: R = self.job.client.function_result(self.id, timeout, allow_pickle=self._allow_pickle)
        return value

    def status(self) -> JobRecord:
        return self.job.status()

    def logs(self, follow: bool = False) -> Iterator[LogLine]:
        return self.job.logs(follow=follow)

    def cancel(self) -> bool:
        return self.job.cancel()


class RemoteFunction(Generic[P, R]):
    """A function that runs on a worker when called through :meth:`remote` or :meth:`map`."""

    def __init__(self, function: Callable[P, R], options: CallOptions, client: Client | None = None) -> None:
        self._function = function
        self._call_options = options
        self._bound = client
        functools.update_wrapper(self, function)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Runs here, in this process, as if it were not decorated."""
        return self._function(*args, **kwargs)

    def options(self, **changes: Unpack[RemoteKeywords]) -> RemoteFunction[P, R]:
        """A copy with other requirements or options, e.g. ``f.options(gpus=2, timeout=600)``."""
        options, client = _options(self._call_options, dict(changes))
        return RemoteFunction(self._function, options, client or self._bound)

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> FunctionHandle[R]:
        """Submit one call and return its handle at once."""
        client = self._client()
        [job] = client.submit_calls(self._function, [(args, kwargs)], self._call_options)
        return FunctionHandle(job, self._call_options.allow_pickle)

    @overload
    def map(
        self,
        iterable: Iterable[Any],
        *,
        ordered: bool = ...,
        max_in_flight: int | None = ...,
        return_exceptions: Literal[False] = ...,
    ) -> Iterator[R]: ...

    @overload
    def map(
        self,
        iterable: Iterable[Any],
        *,
        ordered: bool = ...,
        max_in_flight: int | None = ...,
        return_exceptions: Literal[True],
    ) -> Iterator[R | Exception]: ...

    def map(
        self,
        iterable: Iterable[Any],
        *,
        ordered: bool = True,
        max_in_flight: int | None = None,
        return_exceptions: bool = False,
    ) -> Iterator[Any]:
        """One call per item, submitted at once in batches (one round trip each), at most
        ``max_in_flight`` unfinished at a time (default 10,000). Yields each value in the order of
        ``iterable``, or as calls end with ``ordered=False``; a call's exception is raised when its
        turn comes, or yielded in its place with ``return_exceptions=True``. Leaving the loop early
        cancels the calls not yet finished."""
        calls: Iterator[Call] = (((item,), {}) for item in iterable)
        return self._map(calls, ordered, max_in_flight, return_exceptions)

    def starmap(
        self, iterable: Iterable[Iterable[Any]], *, ordered: bool = True, max_in_flight: int | None = None
    ) -> Iterator[R]:
        """Like :meth:`map`, each item being the positional arguments of one call."""
        calls: Iterator[Call] = ((tuple(args), {}) for args in iterable)
        values: Iterator[R] = self._map(calls, ordered, max_in_flight, return_exceptions=False)
        return values

    def _client(self) -> Client:
        return self._bound or default_client()

    def _map(
        self,
        calls: Iterator[Call],
        ordered: bool,
        max_in_flight: int | None,
        return_exceptions: bool,
    ) -> Iterator[Any]:
        return self._client().map_calls(
            self._function,
            calls,
            self._call_options,
            ordered=ordered,
            max_in_flight=max_in_flight,
            return_exceptions=return_exceptions,
        )


class RemoteKeywords(CallKeywords, total=False):
    """What ``@gl.remote`` takes: the call options and requirements, and the client to submit with."""

    client: Client | None


@overload
def remote(function: Callable[P, R], /) -> RemoteFunction[P, R]: ...


@overload
def remote(**options: Unpack[RemoteKeywords]) -> Callable[[Callable[P, R]], RemoteFunction[P, R]]: ...


def remote(function: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Make ``function`` runnable on a worker: ``f.remote(...)``, ``f.map(...)``, ``f.options(...)``;
    ``f(...)`` still runs here, unchanged. Takes what the machine must have (``accelerator``,
    ``gpus``, ``gpu_memory``, ``gpu_name``, ``frameworks`` as ``{"torch": ">=2.1"}`` or
    ``["torch>=2.1"]``, ``cpus``, ``memory``, ``labels``) and how calls run (``timeout``,
    ``retries``, ``retry_on``, ``retry_delay``, ``priority``, ``fresh_process``, ``source``: the
    folder shipped with the code, ``client``). ``nodes``, ``procs_per_node`` and ``launcher`` make
    each call a gang job: every rank calls the function, and the value is rank 0's (see
    docs/distributed.md). ``allow_pickle=True`` unpickles its results whole, code included, instead
    of as data only (docs/sdk.md): for workers trusted with code. Bad options raise
    :class:`InvalidJobSpec` here."""
    call_options, client = _options(
        CallOptions(), {key: value for key, value in options.items() if value is not None}
    )

    def decorate(target: Callable[P, R]) -> RemoteFunction[P, R]:
        return RemoteFunction(target, call_options, client)

    return decorate(function) if function is not None else decorate
