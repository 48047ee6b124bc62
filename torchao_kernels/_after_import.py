"""Calling back right after another package's module has executed, without
importing that package ourselves: how this package meets torchao whatever the
order of `import torchao` and `import torchao_kernels`."""
from __future__ import annotations

import importlib.abc
import sys
from typing import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, fullname: str, callback: Callable[[], None], once: bool, always: bool):
        self.fullname, self.callback, self.once, self.always = fullname, callback, once, always

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            ok = False
            try:
                run(module)
                ok = True
            finally:
                if ok or self.always:
                    try:
                        self.callback()
                    finally:
                        if self.once:
                            uninstall(self)

        loader.exec_module = exec_module  # this spec's own loader object
        return spec


def after_import(fullname: str, callback: Callable[[], None], *, once: bool = True,
                 always: bool = False) -> _AfterImport:
    """Calls callback() each time (once: the first time) module `fullname`
    has executed; always: also when its execution raised (what it registered
    before the error stays registered). Returns the hook, for uninstall()."""
    hook = _AfterImport(fullname, callback, once, always)
    sys.meta_path.insert(0, hook)
    return hook


def uninstall(hook: _AfterImport) -> None:
    try:
        sys.meta_path.remove(hook)
    except ValueError:
        pass
