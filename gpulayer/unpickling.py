"""Results are data: what a client unpickles of a function's result is built from an allow-list of
globals, as ``torch.load(weights_only=True)`` builds a checkpoint, so a worker's credentials, which
sign results, cannot run code on a client.

A pickle calls the globals it names; :class:`_DataUnpickler` resolves only these:

- builtins' containers, scalars and exception classes, and the standard library's data classes
  (``collections``, ``datetime``, ``decimal``, ``fractions``, ``uuid``, ``pathlib``, ``zoneinfo``);
- numpy's arrays, dtypes and scalars, torch's tensors (rebuilt by ``torch.load(weights_only=True)``),
  sizes, dtypes and devices, pandas' frames, series, indexes, arrays and times;
- exception classes of modules this process has already imported;
- classes (never functions) of the caller's own code (:class:`OwnCode`) whose every base is admitted
  too: a class of the project that derives from ``subprocess.Popen`` is not data.

Anything else (``os.system``, ``builtins.exec``, ``subprocess.Popen``, any ``__reduce__`` target) is
refused before it is called, naming it (:class:`Refused`). No module is imported to resolve a name
but numpy, torch and pandas' own, the standard library's listed here, and the caller's own.
``allow_pickle`` (:class:`Policy`) unpickles anything, as ``pickle.loads`` does.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
import importlib.util
import io
import pickle
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle

#: The standard library's classes and constants that are data: built from what the pickle holds,
#: they call nothing of it.
_STDLIB = {
    "builtins": {
        *("dict", "list", "tuple", "set", "frozenset", "str", "bytes", "bytearray"),
        *("int", "float", "complex", "bool", "slice", "range", "Ellipsis", "NotImplemented"),
    },
    "collections": {"OrderedDict", "deque", "Counter", "defaultdict"},
    "datetime": {"datetime", "date", "time", "timedelta", "timezone"},
    "decimal": {"Decimal"},
    "fractions": {"Fraction"},
    "uuid": {"UUID"},
    "pathlib": {"PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath", "WindowsPath"},
    "zoneinfo": {"ZoneInfo"},
}
#: What numpy's pickles call, under numpy 2's module names and numpy 1's.
_NUMPY = {
    **{f"numpy.{core}.multiarray": {"_reconstruct", "scalar"} for core in ("_core", "core")},
    **{f"numpy.{core}.numeric": {"_frombuffer"} for core in ("_core", "core")},
    "numpy": {"ndarray", "dtype"},
    "numpy.ma": {"MaskedArray"},
    "numpy.ma.core": {"MaskedArray", "_mareconstruct"},
}
_TORCH = {
    "torch": {"Size", "device"},
    "torch.serialization": {"_get_layout"},
}
#: pandas' rebuilders: each makes one of its data classes from what the pickle holds.
_PANDAS = {
    "pandas": {"NA", "NaT"},
    "pandas._libs.arrays": {"__pyx_unpickle_NDArrayBacked"},
    "pandas._libs.internals": {"_unpickle_block"},
    "pandas.core.indexes.base": {"_new_Index"},
    "pandas.core.indexes.datetimes": {"_new_DatetimeIndex"},
    "pandas.core.indexes.timedeltas": {"_new_TimedeltaIndex"},
    "pandas.core.indexes.period": {"_new_PeriodIndex"},
    "pandas._libs.tslibs.timestamps": {"_unpickle_timestamp"},
    "pandas._libs.tslibs.timedeltas": {"_timedelta_unpickle"},
    "pandas._libs.tslibs.nattype": {"_nat_unpickle", "__nat_unpickle"},
}
_LIBRARIES = {"numpy": _NUMPY, "torch": _TORCH, "pandas": _PANDAS}
#: Bases a data class of the caller's may have besides data classes: they add no behaviour to building.
_MIXINS = {
    "abc": {"ABC"},
    "typing": {"Generic", "Protocol"},
    "enum": {"Enum", "IntEnum", "Flag", "IntFlag", "StrEnum", "ReprEnum"},
    "pydantic.main": {"BaseModel"},
}
#: What a pickle asks for to be told why it is refused.
_BY_VALUE = "code pickled by value: a function, or a class defined inside one"


class Refused(Exception):
    """A pickle names a global that is not data; ``name`` says which, ``reason`` why."""

    def __init__(self, name: str, reason: str = "which is not data") -> None:
        super().__init__(f"{name}, {reason}")
        self.name = name
        self.reason = reason


class OwnCode:
    """The caller's own modules: ``__main__``, those registered with cloudpickle to travel by value,
    and those whose file is among ``files()`` (what this client ships in code bundles)."""

    def __init__(self, files: Callable[[], Collection[Path]]) -> None:
        self._files = files

    def module(self, name: str) -> ModuleType | None:
        """The module, imported if it is the caller's and not imported yet; None if it is not theirs."""
        module = sys.modules.get(name)
        if name == "__main__" or registered_by_value(name):
            return module
        if module is not None:
            file = getattr(module, "__file__", None)
            return module if file and Path(file).resolve() in self._files() else None
        file = _file_of(name)
        if file is None or file not in self._files():
            return None
        return importlib.import_module(name)  # the caller's own code, which a call would run anyway


def registered_by_value(name: str) -> bool:
    """Whether cloudpickle sends module ``name`` by value (``register_pickle_by_value``, on it or a
    package of it)."""
    registered = cloudpickle.list_registry_pickle_by_value()
    parts = name.split(".")
    return any(".".join(parts[:end]) in registered for end in range(1, len(parts) + 1))


def _file_of(name: str) -> Path | None:
    """The file ``import name`` would run, found without importing anything: a top-level name's spec
    is looked up without running it, and a submodule's file is found in its package's folders."""
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin).resolve() if spec.origin else None
    for folder in spec.submodule_search_locations or ():
        base = Path(folder, *rest)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a client unpickles results: data only (the default), or anything with ``allow_pickle``,
    for workers it trusts with code."""

    own: OwnCode
    allow_pickle: bool = False
    #: What each admitted name resolved to, so a map's thousand results look each up once.
    admitted: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict, compare=False)


def loads_data(payload: bytes, policy: Policy) -> Any:
    """``payload`` unpickled under ``policy``; :class:`Refused` for a global that is not data."""
    if policy.allow_pickle:
        return pickle.loads(payload)
    return _DataUnpickler(io.BytesIO(payload), policy).load()


class _DataUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, policy: Policy) -> None:
        super().__init__(file)
        self._policy = policy

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        found = self._policy.admitted.get(key)
        if found is None:
            found = self._policy.admitted[key] = _resolve(module, name, self._policy.own)
        return found


def _resolve(module: str, name: str, own: OwnCode) -> Any:
    if (module, name) == _OWN_CLASS:
        return _own_class(own)
    if (module, name) in _SPECIAL:
        return _SPECIAL[module, name]
    if name in _STDLIB.get(module, ()):
        return getattr(importlib.import_module(module), name)
    top = module.partition(".")[0]
    if top in _LIBRARIES and (found := _library(top, module, name)) is not None:
        return found
    found = _class(sys.modules.get(module), name)
    if found is not None and _exception(found):  # builtins' too: resolved, never imported for it
        return found
    found = _class(own.module(module), name)
    if found is None:
        reason = f"which is not data ({_BY_VALUE})" if top == "cloudpickle" else "which is not data"
        raise Refused(f"{module}.{name}", reason)
    _check_bases(found, own)
    return found


def _library(top: str, module: str, name: str) -> Any:
    """numpy's, torch's or pandas' data class or rebuilder of that name; None if it is not one."""
    if name in _LIBRARIES[top].get(module, ()):
        return getattr(importlib.import_module(module), name)
    importlib.import_module(top)  # a known library; its submodules are looked at only once it imported them
    found = lookup(sys.modules.get(module), name)
    return found if found is not None and _library_data(found) else None


def _library_data(found: Any) -> bool:
    """Whether ``found`` is a data class (or a dtype) of numpy, torch or pandas that is already imported."""
    numpy, torch, pandas = (sys.modules.get(name) for name in ("numpy", "torch", "pandas"))
    if torch is not None and isinstance(found, torch.dtype):
        return True
    if not isinstance(found, type):
        return False
    kinds: list[type] = []
    if numpy is not None:
        kinds += [numpy.generic, numpy.dtype]
    if torch is not None:
        kinds += [torch.Size, torch.device]
    if pandas is not None:
        kinds += _pandas_data(pandas)
    return issubclass(found, tuple(kinds))


def _pandas_data(pandas: ModuleType) -> list[type]:
    api = pandas.api.extensions
    managers = sys.modules.get("pandas.core.internals.managers")
    offsets = sys.modules.get("pandas._libs.tslibs.offsets")
    sparse = sys.modules.get("pandas._libs.sparse")
    kinds = [pandas.DataFrame, pandas.Series, pandas.Index, api.ExtensionArray, api.ExtensionDtype]
    kinds += [pandas.Timestamp, pandas.Timedelta, pandas.Period, pandas.Interval]
    for module, name in ((managers, "BaseBlockManager"), (offsets, "BaseOffset"), (sparse, "SparseIndex")):
        if module is not None and isinstance(getattr(module, name, None), type):
            kinds.append(getattr(module, name))
    return kinds


def lookup(module: ModuleType | None, qualname: str) -> Any:
    """What ``qualname`` names in ``module``, read from namespaces only (no ``__getattr__`` runs)."""
    found: Any = module
    for part in qualname.split("."):
        if found is None:
            return None
        found = vars(found).get(part) if hasattr(found, "__dict__") else None
    return found


def _class(module: ModuleType | None, qualname: str) -> type | None:
    """The class ``module`` defines under ``qualname``; None for anything else, such as a class or a
    function it imported (``mymodule.os.system``, ``mymodule.Popen``)."""
    found = lookup(module, qualname)
    if module is None or not isinstance(found, type):
        return None
    return found if found.__module__ == module.__name__ and found.__qualname__ == qualname else None


def _exception(found: type) -> bool:
    return issubclass(found, BaseException)


def _check_bases(cls: type, own: OwnCode) -> None:
    """:class:`Refused` unless every class ``cls`` derives from is data, or the caller's, or a mixin."""
    for base in cls.__mro__[1:]:
        if base is object or _exception(base) or _mixin(base) or _library_data(base):
            continue
        if base.__module__ in _STDLIB and base.__name__ in _STDLIB[base.__module__]:
            continue
        if _class(own.module(base.__module__), base.__qualname__) is base:
            continue
        raise Refused(
            f"{cls.__module__}.{cls.__qualname__}",
            f"whose base {base.__module__}.{base.__qualname__} is not data",
        )


def _mixin(base: type) -> bool:
    return base.__qualname__ in _MIXINS.get(base.__module__, ())


def own_class(module: str, qualname: str) -> type:
    """A class a worker sent by name (:func:`gpulayer.payloads.dump_result`): one the caller defined
    in its script or sent by value, which a worker cannot import. Under ``allow_pickle``, found
    wherever it is; as data, only in the caller's own code (:func:`_own_class`)."""
    found = _class(importlib.import_module(module), qualname)
    if found is None:
        raise pickle.UnpicklingError(f"no class {module}.{qualname} here")
    return found


def _own_class(own: OwnCode) -> Callable[[str, str], type]:
    def resolve(module: str, qualname: str) -> type:
        found = _class(own.module(module), qualname)
        if found is None:
            raise Refused(
                f"{module}.{qualname}",
                "which is no class of this program's own code (define it at the top level of the "
                "script or of a module of the project)",
            )
        _check_bases(found, own)
        return found

    return resolve


def load_tensor(saved: bytes) -> Any:
    """A tensor a worker saved with ``torch.save`` (:func:`gpulayer.payloads.dump_result`), loaded with
    ``weights_only=True``; onto the CPU when this machine lacks its device."""
    torch = importlib.import_module("torch")
    location = None if torch.cuda.is_available() else "cpu"
    return torch.load(io.BytesIO(saved), weights_only=True, map_location=location)


def _type(*args: Any) -> type:
    """``builtins.type``, as a pickle of ``type(None)`` calls it: for the types of constants only."""
    if len(args) != 1 or not any(args[0] is constant for constant in (None, Ellipsis, NotImplemented)):
        raise Refused("builtins.type", "called to make a class, which is not data")
    return builtins.type(args[0])


def _getattr(*args: Any) -> Any:
    """``builtins.getattr``, as a pickle of a ``zoneinfo.ZoneInfo`` calls it: for that only."""
    zoneinfo = sys.modules.get("zoneinfo")
    if zoneinfo is None or args != (zoneinfo.ZoneInfo, "_unpickle"):
        raise Refused("builtins.getattr", "called for something other than a time zone, which is not data")
    return zoneinfo.ZoneInfo._unpickle


_OWN_CLASS = ("gpulayer.unpickling", "own_class")
#: Globals admitted as a stand-in that checks what it is called with, or as our own rebuilder.
_SPECIAL: dict[tuple[str, str], Any] = {
    ("builtins", "type"): _type,
    ("builtins", "getattr"): _getattr,
    ("gpulayer.unpickling", "load_tensor"): load_tensor,
}
