"""Component registry: what the installed plugins provide, by kind and name.

Plugins never hand over heavy objects at registration time: a component is a name, an
optional pydantic model for its kwargs, and a factory that is imported only when a run
selects the component.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = [
    "KINDS",
    "Component",
    "DuplicateComponentError",
    "PluginInfo",
    "Register",
    "Registry",
    "UnavailableComponentError",
    "UnknownComponentError",
    "did_you_mean",
]

#: Component kinds, in the order their registration hooks are called.
KINDS: tuple[str, ...] = (
    "algorithm",
    "trainer_backend",
    "inference_engine",
    "environment",
    "eval",
    "sandbox_provider",
    "logger",
)


def did_you_mean(name: str, candidates: list[str] | tuple[str, ...]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest candidate, or an empty string."""
    close = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


@dataclass(frozen=True)
class PluginInfo:
    """Where a plugin comes from."""

    name: str
    module: str
    distribution: str
    version: str


class UnknownComponentError(LookupError):
    """A config names a component that no installed plugin registers."""


class UnavailableComponentError(RuntimeError):
    """The component is registered but cannot run here (e.g. a missing dependency)."""


class DuplicateComponentError(ValueError):
    """Two plugins register the same name for the same kind."""


@dataclass(frozen=True)
class Component:
    """One registered component."""

    kind: str
    name: str
    factory: str | Callable[..., Any]
    kwargs_model: type[BaseModel] | None
    description: str
    plugin: PluginInfo
    unavailable: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        """True when the component can be selected."""
        return self.unavailable is None

    def load_factory(self) -> Callable[..., Any]:
        """Import and return the factory (a string ``"module:attr"`` is imported now)."""
        if self.unavailable is not None:
            raise UnavailableComponentError(
                f"{self.kind} '{self.name}' (from {self.plugin.distribution}) is unavailable: "
                f"{self.unavailable}"
            )
        if callable(self.factory):
            return self.factory
        module_name, _, attr = self.factory.partition(":")
        module = importlib.import_module(module_name)
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj  # type: ignore[no-any-return]

    def validate_kwargs(self, kwargs: dict[str, Any] | None) -> BaseModel | None:
        """Validate ``kwargs`` with the component's model (``None`` when it has none).

        Raises:
            pydantic.ValidationError: the kwargs do not fit the model.
            TypeError: kwargs were given to a component that declares none.
        """
        kwargs = dict(kwargs or {})
        if self.kwargs_model is None:
            if kwargs:
                raise TypeError(f"{self.kind} '{self.name}' takes no kwargs, got {sorted(kwargs)}")
            return None
        return self.kwargs_model.model_validate(kwargs)

    def create(self, kwargs: dict[str, Any] | None = None, **extra: Any) -> Any:
        """Validate ``kwargs`` and build the component through its factory.

        The factory receives the validated kwargs model as ``kwargs=`` (when the component
        declares one) plus any ``extra`` keyword arguments the host passes.
        """
        factory = self.load_factory()
        model = self.validate_kwargs(kwargs)
        if model is not None:
            return factory(kwargs=model, **extra)
        return factory(**extra)


class Registry:
    """All components of a plugin set, by kind and name."""

    def __init__(self) -> None:
        self._components: dict[str, dict[str, Component]] = {k: {} for k in KINDS}

    def add(self, component: Component) -> None:
        """Add ``component``; a name already taken by another plugin is an error."""
        table = self._components[component.kind]
        existing = table.get(component.name)
        if existing is not None:
            raise DuplicateComponentError(
                f"{component.kind} '{component.name}' is registered twice: by "
                f"{existing.plugin.distribution} (plugin '{existing.plugin.name}') and by "
                f"{component.plugin.distribution} (plugin '{component.plugin.name}'). "
                "Uninstall one, or block one with TELESCOPE_DISABLE_PLUGINS="
                f"{component.plugin.name}."
            )
        table[component.name] = component

    def names(self, kind: str, *, available_only: bool = False) -> list[str]:
        """Registered names of ``kind``, sorted."""
        return sorted(n for n, c in self._components[kind].items() if c.available or not available_only)

    def components(self, kind: str | None = None) -> Iterator[Component]:
        """Iterate over components (of one kind, or all kinds in ``KINDS`` order)."""
        for k in KINDS if kind is None else (kind,):
            yield from (self._components[k][n] for n in sorted(self._components[k]))

    def has(self, kind: str, name: str) -> bool:
        """True when ``name`` is registered for ``kind``."""
        return name in self._components[kind]

    def get(self, kind: str, name: str) -> Component:
        """Return the component, or raise ``UnknownComponentError`` listing valid names."""
        try:
            return self._components[kind][name]
        except KeyError:
            valid = self.names(kind)
            listing = ", ".join(valid) if valid else "(none installed)"
            raise UnknownComponentError(
                f"unknown {kind.replace('_', ' ')} '{name}'.{did_you_mean(name, valid)} "
                f"Registered: {listing}."
            ) from None

    def create(self, kind: str, name: str, kwargs: dict[str, Any] | None = None, **extra: Any) -> Any:
        """Shorthand for ``get(kind, name).create(kwargs, **extra)``."""
        return self.get(kind, name).create(kwargs, **extra)


class Register:
    """The object handed to ``telescope_register_*`` hooks, bound to one plugin and kind."""

    def __init__(self, registry: Registry, kind: str, plugin: PluginInfo) -> None:
        self._registry = registry
        self.kind = kind
        self.plugin = plugin

    def add(
        self,
        name: str,
        factory: str | Callable[..., Any],
        *,
        kwargs_model: type[BaseModel] | None = None,
        description: str = "",
        unavailable: str | None = None,
        **meta: Any,
    ) -> None:
        """Register a component.

        Args:
            name: the name users write in their config.
            factory: ``"package.module:attribute"`` (imported lazily) or a callable.
            kwargs_model: pydantic model validating the component's kwargs.
            description: one line shown by ``telescope plugins list``.
            unavailable: why the component cannot run here (listed, not selectable).
            **meta: kind-specific metadata (e.g. ``multi_turn=True`` for environments).
        """
        if not name or not isinstance(name, str):
            raise ValueError(f"plugin '{self.plugin.name}' registered a {self.kind} with no name")
        if isinstance(factory, str) and ":" not in factory:
            raise ValueError(
                f"{self.kind} '{name}' from plugin '{self.plugin.name}': factory {factory!r} "
                "must be 'module:attribute'"
            )
        self._registry.add(
            Component(self.kind, name, factory, kwargs_model, description, self.plugin, unavailable, meta)
        )


def format_validation_error(prefix: str, err: ValidationError) -> list[str]:
    """Turn a pydantic error into one readable line per problem, prefixed by a path."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        where = f"{prefix}.{loc}" if loc else prefix
        value = e.get("input")
        shown = "" if e["type"] == "missing" else f" (got {value!r})"
        lines.append(f"{where}: {e['msg']}{shown}")
    return lines
