"""GGUF files: check the architecture, count parameters, and cache the dequantised weights as safetensors.

transformers dequantises a GGUF to float on every load (~12 s for SmolLM2-135M on 2 CPU cores); after the first
load we keep the float weights in ``~/.cache/specviz/models`` (``SPECVIZ_CACHE_DIR``) and load those instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from specviz.errors import SpecvizError, UnsupportedModelError

CACHE_ENV = "SPECVIZ_CACHE_DIR"
#: GGUF architectures that are encoders or otherwise not causal LMs, although transformers can read them.
NOT_CAUSAL = frozenset({"t5", "t5encoder", "bert", "nomic-bert", "jina-bert-v2"})


def cache_root() -> Path:
    """Where converted models are kept (outside the repository)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "specviz" / "models"


def gguf_metadata(path: Path) -> tuple[str, int]:
    """The GGUF's ``general.architecture`` and its parameter count, read without dequantising anything."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8")
    except (OSError, ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError) as error:  # bad/foreign file
        raise SpecvizError(f"{path} is not a readable GGUF file ({type(error).__name__}: {error})") from None
    numel = sum(int(tensor.n_elements) for tensor in reader.tensors)
    return architecture, numel


def check_architecture(path: Path, architecture: str) -> None:
    """Refuse GGUF architectures that transformers cannot turn into a causal LM."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    supported = set(GGUF_SUPPORTED_ARCHITECTURES) - NOT_CAUSAL
    name = architecture.replace("-", "_")
    if architecture not in supported and name not in supported:
        raise UnsupportedModelError(f"{path.name}: GGUF architecture {architecture!r} is not supported "
                                    f"(supported: {', '.join(sorted(supported))})")


#: Converted copies kept per GGUF name; older ones are removed when a new one is written.
KEEP_PER_NAME = 2
_DIGESTS: dict[tuple, str] = {}


def cache_dir_for(path: Path) -> Path:
    """A cache folder keyed by the GGUF's name and content: the same file installed at another path (a fresh
    checkout, a reinstall) reuses its copy, and a changed file gets a new one."""
    stat = path.stat()
    seen = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if seen not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[seen] = digest.hexdigest()[:16]
    return cache_root() / f"{path.stem}-{_DIGESTS[seen]}"


def _prune(folder: Path) -> None:
    """Remove all but the newest ``KEEP_PER_NAME`` converted copies of ``folder``'s GGUF name (each is the full float
    model: a copy per changed file would grow without end)."""
    stem = folder.name.rsplit("-", 1)[0]
    copies = sorted((p for p in folder.parent.glob(f"{stem}-*") if p.is_dir() and is_cached(p)
                     and p.name.rsplit("-", 1)[0] == stem), key=lambda p: (p == folder, p.stat().st_mtime))
    for old in copies[:-KEEP_PER_NAME]:
        shutil.rmtree(old, ignore_errors=True)


def is_cached(folder: Path) -> bool:
    """A complete cache folder has weights, config and tokenizer (written last, so partial copies never count)."""
    return (folder / "COMPLETE").is_file()


def write_cache(model, tokenizer, folder: Path) -> None:
    """Save dequantised float weights + config + tokenizer atomically (temp folder, then rename)."""
    from safetensors.torch import save_model

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "COMPLETE").write_text("ok\n")
        if is_cached(folder):  # another process wrote it meanwhile (and may be reading it): keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
            return
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
        _prune(folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a cache is an optimisation: failing to write one is not an error
