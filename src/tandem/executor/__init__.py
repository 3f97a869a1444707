"""Executors: where and how the model runner executes a step (see ``base.py``)."""

from __future__ import annotations

from tandem.executor.base import Executor, ExecutorError


_REGISTERED: dict[str, type[Executor]] = {}


def register_executor(cls: type[Executor]) -> type[Executor]:
    """Make ``cls`` selectable as ``executor_backend=cls.name`` (a class decorator): executors beyond the
    built-in ``uni``, ``mp`` and ``ray`` (tests register a scripted one)."""
    _REGISTERED[cls.name] = cls
    return cls


def executor_classes() -> dict[str, type[Executor]]:
    from tandem.executor.multiproc import MultiprocExecutor
    from tandem.executor.ray_executor import RayExecutor  # imports ray only when built
    from tandem.executor.uniproc import UniProcExecutor

    return {cls.name: cls for cls in (UniProcExecutor, MultiprocExecutor, RayExecutor)} | _REGISTERED


def get_executor_class(name: str) -> type[Executor]:
    classes = executor_classes()
    if name not in classes:
        raise ValueError(f"unknown executor_backend {name!r}; choose one of {sorted(classes)}")
    return classes[name]


__all__ = ["Executor", "ExecutorError", "executor_classes", "get_executor_class", "register_executor"]
