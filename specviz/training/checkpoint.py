"""Resumable training checkpoints as safetensors + JSON (no pickles, so a checkpoint is safe to share).

A checkpoint folder holds ``student.safetensors`` (weights), ``optimizer.safetensors`` (AdamW moments, keyed by
parameter name) and ``state.json`` (step, optimizer step counts, RNG states, the run's arguments).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

#: Checkpoints kept per run: a 17M-parameter student's checkpoint is ~200 MB, so keeping every one fills disks.
KEEP_CHECKPOINTS = 3


def save_checkpoint(folder: Path, step: int, student: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    extra: dict, *, keep: int = KEEP_CHECKPOINTS) -> None:
    """Write a checkpoint atomically, point ``latest`` at it, and delete all but the newest ``keep`` siblings."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # tied weights share storage and safetensors refuses duplicates: keep the first name of each storage
    weights, seen = {}, set()
    for name, value in student.state_dict().items():
        if value.data_ptr() not in seen:
            seen.add(value.data_ptr())
            weights[name] = value.detach().contiguous().cpu()
    save_file(weights, str(tmp / "student.safetensors"))
    names = {id(p): n for n, p in student.named_parameters()}
    moments, steps = {}, {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state:
                continue
            name = names[id(param)]
            moments[f"{name}.exp_avg"] = state["exp_avg"].contiguous().cpu()
            moments[f"{name}.exp_avg_sq"] = state["exp_avg_sq"].contiguous().cpu()
            steps[name] = float(state["step"])
    save_file(moments, str(tmp / "optimizer.safetensors"))
    state = {"step": step, "optimizer_steps": steps, "extra": extra,
             "torch_rng": torch.get_rng_state().tolist(), "python_rng": _py_state()}
    (tmp / "state.json").write_text(json.dumps(state))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    (folder.parent / "latest").write_text(folder.name + "\n")
    prune_checkpoints(folder.parent, keep)


def prune_checkpoints(root: Path, keep: int) -> None:
    """Remove ``step-*`` folders older than the newest ``keep`` (names sort by step: they are zero-padded)."""
    folders = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in folders[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(root: Path) -> Path | None:
    """The folder named by ``root/latest``, if it exists and is complete; without a pointer (a checkpoint folder
    copied in from another run to continue it), the newest complete ``step-*`` folder."""
    pointer = root / "latest"
    if not pointer.is_file():
        complete = sorted(p for p in root.glob("step-*") if (p / "state.json").is_file())
        return complete[-1] if complete else None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "state.json").is_file() else None


def load_checkpoint(folder: Path, student: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore weights, AdamW moments and RNG states; return the saved state dict (step, extra)."""
    weights = load_file(str(folder / "student.safetensors"))
    student.load_state_dict(weights, strict=False)
    if hasattr(student, "tie_weights"):
        student.tie_weights()
    state = json.loads((folder / "state.json").read_text())
    moments = load_file(str(folder / "optimizer.safetensors"))
    for name, param in student.named_parameters():
        if f"{name}.exp_avg" in moments:
            optimizer.state[param] = {
                "step": torch.tensor(state["optimizer_steps"][name]),
                "exp_avg": moments[f"{name}.exp_avg"].to(param.device),
                "exp_avg_sq": moments[f"{name}.exp_avg_sq"].to(param.device),
            }
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    return state


def _py_state() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]
