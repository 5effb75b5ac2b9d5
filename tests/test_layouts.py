"""The generic reader of checkpoint layouts (``specviz.drafters.layouts``): the name patterns both ways, expansion
over a range, conversions, carried copies, and the one-line refusals every family inherits."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from specviz.drafters.layouts import Convert, Format, Layout, expand, fill, match
from specviz.errors import SpecvizError


def test_patterns_match_and_fill_both_ways():
    env = {"L": 30, "N": 2}
    assert match("layers.{k}.enorm.{rest}", "layers.3.enorm.weight", env) == {"k": 3, "rest": "weight"}
    assert match("model.layers.{k+L}.{rest}", "model.layers.31.mlp.up_proj.weight", env) == {
        "k": 1, "rest": "mlp.up_proj.weight"}
    assert match("model.layers.{k+L}.{rest}", "model.layers.29.mlp.up_proj.weight", env) is None  # a main layer
    assert match("heads.{i}.{N}.weight", "heads.0.2.weight", env) == {"i": 0}
    assert match("heads.{i}.{N}.weight", "heads.0.1.weight", env) is None  # N is the environment's, not any number
    assert match("layers.{k}.enorm.{rest}", "layers.x.enorm.weight", env) is None  # a letter is a number
    assert match("{rest}norm.weight", "self_attn.q_norm.weight", env) == {"rest": "self_attn.q_"}
    assert match("{rest}rotary_emb.inv_freq", "rotary_emb.inv_freq", env) == {"rest": ""}  # any text, even none
    assert match("blocks.{i}.layers.{i}.weight", "blocks.1.layers.2.weight", env) is None  # one name, one value
    assert fill("model.layers.{k+L}.{rest}", {"k": 1, "rest": "eh_proj.weight"}, env) == \
        "model.layers.31.eh_proj.weight"
    assert fill("heads.{i}.{N}.weight", {"i": 3}, env) == "heads.3.2.weight"
    assert expand("heads.{i}.{N}.weight", {}, {"i": 3, "N": 1}) == [f"heads.{i}.1.weight" for i in range(3)]
    assert expand("layers.{k}.{rest}", {"rest": "w"}, {"k": 2}) == ["layers.0.w", "layers.1.w"]


@dataclass(frozen=True)
class Toy:
    modules: int
    width: int = 4

    def to_dict(self) -> dict:
        return {"modules": self.modules, "width": self.width}

    @classmethod
    def from_dict(cls, data: dict) -> Toy:
        return cls(**data)


def toy_shapes(spec: Toy) -> dict[str, tuple[int, ...]]:
    shapes = {f"layers.{k}.{part}": (spec.width,) for k in range(spec.modules) for part in ("proj", "norm")}
    return {**shapes, "head.weight": (2, spec.width)}


PLUS_ONE = Convert(load=lambda w: w + 1, save=lambda w: w - 1)
SHARED = Layout("shared", recognise=lambda config, keys: config.get("kind") == "shared",
                read=lambda config, target, shapes: Toy(config["count"]),
                write=lambda spec, target_name: {"kind": "shared", "count": spec.modules},
                names=(("layers.{k}.proj", "model.layers.{k+L}.proj"),
                       ("layers.{k}.norm", "model.norm", PLUS_ONE),  # one zero-centred norm for every module
                       ("head.weight", "lm_head.weight")),
                prefixes=("drafter.",), carried=(("model.embed_tokens.weight", "embedding"),),
                refused=(("{rest}.fused", "fused tensors ({name}) are not supported"),), shares="the norm")
TOY = Format(what="toy drafter", layouts=(SHARED,), expected_shapes=toy_shapes, check_fits=lambda spec, target: None,
             unknown="not a toy config (model_type {model_type})", env=lambda spec: {"L": 10, "k": spec.modules})


def checkpoint(spec: Toy) -> dict[str, torch.Tensor]:
    tensors = {f"drafter.model.layers.{10 + k}.proj": torch.full((4,), float(k)) for k in range(spec.modules)}
    return {**tensors, "drafter.model.norm": torch.zeros(4), "lm_head.weight": torch.ones(2, 4),
            "model.embed_tokens.weight": torch.ones(8, 4), "rotary_emb.inv_freq": torch.ones(2)}


def test_loading_expands_shared_tensors_converts_and_returns_carried_copies():
    spec = Toy(modules=3)
    state, carried = TOY.to_state(checkpoint(spec), spec, TOY["shared"])
    assert set(state) == set(toy_shapes(spec))
    assert all(torch.equal(state[f"layers.{k}.norm"], torch.ones(4)) for k in range(3))  # 0 stored, 1 meant
    assert torch.equal(state["layers.2.proj"], torch.full((4,), 2.0))
    assert set(carried) == {"model.embed_tokens.weight"} and carried["model.embed_tokens.weight"][1] == "embedding"
    assert TOY["shared"].ours("drafter.model.norm", {"L": 10, "k": 2}) == ["layers.0.norm", "layers.1.norm"]
    assert TOY["shared"].ours("model.embed_tokens.weight", {"L": 10, "k": 2}) == []  # a carried copy
    assert TOY["shared"].theirs("layers.1.proj", {"L": 10, "k": 2}) == "model.layers.11.proj"
    saved = TOY.from_state(state, spec, TOY["shared"])
    assert set(saved) == {"model.layers.10.proj", "model.layers.11.proj", "model.layers.12.proj", "model.norm",
                          "lm_head.weight"}
    assert torch.equal(saved["model.norm"], torch.zeros(4))


def test_several_of_ours_on_one_name_of_theirs_must_be_equal():
    spec = Toy(modules=2)
    state, _ = TOY.to_state(checkpoint(spec), spec, TOY["shared"])
    state["layers.1.norm"] = torch.full((4,), 3.0)
    with pytest.raises(SpecvizError, match="the shared layout shares the norm; these differ") as error:
        TOY.from_state(state, spec, TOY["shared"])
    assert "\n" not in str(error.value)


def test_refusals_name_the_checkpoints_own_tensors():
    spec = Toy(modules=2)
    cases = {"unexpected": ({"drafter.model.layers.15.proj": torch.zeros(4)}, "unexpected tensors for this config "
                                                                              "in the shared layout: drafter.model"),
             "stray": ({"something.else": torch.zeros(4)}, "unexpected tensors .*something.else"),
             "missing": ({}, None), "shape": ({"lm_head.weight": torch.ones(3, 4)}, None),
             "refused": ({"layers.0.fused": torch.zeros(4)}, r"fused tensors \(layers.0.fused\) are not supported")}
    for name, (change, message) in cases.items():
        tensors = {**checkpoint(spec), **change}
        if name == "missing":
            tensors.pop("drafter.model.layers.11.proj")
            message = "missing tensor model.layers.11.proj$"
        if name == "shape":
            message = r"tensor lm_head.weight has shape \[3, 4\], expected \[2, 4\] for this config"
        with pytest.raises(SpecvizError, match=message) as error:
            TOY.to_state(tensors, spec, TOY["shared"])
        assert "\n" not in str(error.value), name


def test_unknown_layouts_and_configs_are_refused_in_one_line():
    with pytest.raises(SpecvizError, match="unknown toy drafter layout 'nope'; known: shared"):
        TOY["nope"]
    with pytest.raises(SpecvizError, match="not a toy config \\(model_type llama\\)"):
        TOY.layout_of({"model_type": "llama"}, {"x"})
    assert TOY.layout_of({"kind": "shared"}).name == "shared"
    assert TOY.verdict({"kind": "shared", "count": 2}, None) == ("shared", None)


def test_keys_decide_before_the_config():
    """With tensor names known, a layout that recognises them wins over one that only recognises the config."""
    by_keys = Layout("by-keys", recognise=lambda config, keys: keys is not None and "x" in keys,
                     read=SHARED.read, write=SHARED.write)
    by_config = Layout("by-config", recognise=lambda config, keys: True, read=SHARED.read, write=SHARED.write)
    both = Format(what="toy", layouts=(by_config, by_keys), expected_shapes=toy_shapes,
                  check_fits=lambda spec, target: None, unknown="none")
    assert both.layout_of({}, {"x"}).name == "by-config"  # recognisers see the keys first, in declared order
    keyed = Format(what="toy", layouts=(Layout("by-config", recognise=lambda config, keys: keys is None,
                                               read=SHARED.read, write=SHARED.write), by_keys),
                   expected_shapes=toy_shapes, check_fits=lambda spec, target: None, unknown="none")
    assert keyed.layout_of({}, {"x"}).name == "by-keys"
    assert keyed.layout_of({}, {"y"}).name == "by-config"  # names that settle nothing: the config decides
