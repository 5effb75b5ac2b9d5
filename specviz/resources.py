"""Files shipped inside the package: the drafters' weights, the app's CSS, the example prompts and traces.

They are found through ``importlib.resources`` from the package itself, so an installed specviz (``pip install .``,
run from any folder) reads them as a checkout does. specviz installs as plain files, never imported from a zip, so
each is a real filesystem path; the loaders and transformers' ``from_pretrained`` need one, and ``as_file`` would
only hand back the same path.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

#: The package folder (``specviz/`` in a checkout, ``site-packages/specviz/`` once installed).
PACKAGE = Path(str(files("specviz")))
#: Shipped drafters, one folder each (fp16 safetensors + config + model card), and the app's CSS.
ASSETS = PACKAGE / "assets"
MODELS = ASSETS / "models"
CSS = ASSETS / "css" / "specviz.css"
#: Spec-Bench prompts (the app's picker, the benchmark's dev set) and the recorded traces the app opens on.
EXAMPLES = PACKAGE / "examples"
