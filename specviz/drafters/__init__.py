"""Drafter families, one module each, behind the engine's ``Drafter`` contract (``specviz.engine.drafter``).

Importing the package imports every module in it, so each family registers itself with ``registry``; adding a
family is one new module (plus its tests) and no edit here.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
