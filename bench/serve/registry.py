"""Back-ends by name, each registered once by its own module.

A back-end lives in a module named after it, ``<package>.<prefix><name>``, and registers itself
there with ``@registry.register(name, needs=...)``, saying which image fields it cannot do
without. The registry imports that module only when the name is first asked for, so what a
back-end imports (the docker SDK) is loaded only for the runs that use it; and the names are
found from the module files, so adding a back-end is adding its module.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    make: T  # what the back-end registered: a class, or a function that starts one
    needs: tuple[str, ...]  # image fields (bench.core.config.Image) it cannot run without


class Registry(Generic[T]):
    def __init__(self, package: str, prefix: str, first: str | None = None):
        self.package = package
        self.prefix = prefix
        self.first = first  # listed before the others: the default back-end
        self._entries: dict[str, Entry[T]] = {}

    def module(self, name: str) -> str:
        return f"{self.package}.{self.prefix}{name}"

    def register(self, name: str, needs: tuple[str, ...] = ()) -> Callable[[T], T]:
        def add(make: T) -> T:
            # A back-end registered from another module would never be found by its name.
            where = getattr(make, "__module__", None)
            if where != self.module(name):
                raise TypeError(f"back-end {name!r} must be registered from {self.module(name)}, not {where}")
            if name in self._entries:
                raise ValueError(f"back-end {name!r} is registered twice")
            self._entries[name] = Entry(name, make, tuple(needs))
            return make
        return add

    def names(self) -> list[str]:
        path = importlib.import_module(self.package).__path__
        found = [m.name.removeprefix(self.prefix) for m in pkgutil.iter_modules(path) if m.name.startswith(self.prefix)]
        return sorted(found, key=lambda n: (n != self.first, n))

    def entry(self, name: str) -> Entry[T]:
        if name not in self._entries:
            try:
                importlib.import_module(self.module(name))
            except ModuleNotFoundError as exc:
                if exc.name != self.module(name):
                    raise
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no back-end {name!r} in {self.package} (known: {', '.join(self.names())})") from None
