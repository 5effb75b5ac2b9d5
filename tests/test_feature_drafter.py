"""What every feature-reading family inherits from ``FeatureDrafter``: caches sized from the run it is told about,
rows consumed in order, and one-line refusals when the engine and the drafter lose step."""

from __future__ import annotations

import pytest
import tiny
import torch

from specviz.drafters.dflash import DFlashDrafter, DSparkDrafter, new_model
from specviz.drafters.eagle import EagleDrafter, new_head
from specviz.drafters.feature_drafter import FeatureDrafter
from specviz.drafters.medusa import MedusaDrafter, new_heads
from specviz.drafters.mtp import MtpDrafter, new_stack
from specviz.engine.drafter import ROOM_SLACK, DraftBudget, cache_capacity
from specviz.engine.features import TargetFeatures
from specviz.engine.loop import Generation, GenerationConfig
from specviz.errors import SpecvizError

VOCAB = 64
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3]


@pytest.fixture(scope="module")
def target():
    return tiny.target("llama", VOCAB, layers=6, scale=25)


@pytest.fixture(scope="module")
def drafters(target):
    model = target.model
    return {
        "eagle3": lambda: EagleDrafter(new_head(model, "eagle3", seed=1), VOCAB),
        "mtp": lambda: MtpDrafter(new_stack(model, 2, seed=1), VOCAB),
        "medusa": lambda: MedusaDrafter(new_heads(model, 3, seed=1), VOCAB),
        "dflash": lambda: DFlashDrafter(new_model(model, "dflash", mask_token_id=VOCAB - 1, seed=1), VOCAB),
        "dspark": lambda: DSparkDrafter(new_model(model, "dspark", mask_token_id=VOCAB - 1, seed=1, markov_rank=8),
                                        VOCAB),
    }


FAMILIES = ["eagle3", "mtp", "medusa", "dflash", "dspark"]


@pytest.mark.parametrize("family", FAMILIES)
def test_caches_are_sized_from_the_run_it_is_told(drafters, family):
    drafter = drafters[family]()
    assert isinstance(drafter, FeatureDrafter)
    budget = DraftBudget(tree=True, width=3, depth=2, max_nodes=6)
    drafter.begin(PROMPT, 20, budget)
    assert drafter.capacity == len(PROMPT) + 20 + 3 * 2 + ROOM_SLACK + drafter.extra_room()
    drafter.begin(PROMPT)  # told nothing: the most any run may ask
    assert drafter.capacity == cache_capacity(len(PROMPT)) + drafter.extra_room() > 4096


@pytest.mark.parametrize("family", FAMILIES)
def test_a_run_tells_its_drafter_its_length_and_budget(target, drafters, family):
    drafter = drafters[family]()
    budget = DraftBudget(k=3)
    run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=12), drafter, budget).run()
    assert len(run.new_tokens) == 12
    assert drafter.capacity == len(PROMPT) + 12 + 3 + ROOM_SLACK + drafter.extra_room()


def features(layers: tuple[int, ...], start: int, count: int, width: int = 32) -> TargetFeatures:
    return TargetFeatures(start=start, layers=layers, hidden=torch.randn(count, len(layers), width))


@pytest.mark.parametrize("family", FAMILIES)
def test_losing_step_is_one_line(drafters, family):
    drafter = drafters[family]()
    layers = drafter.feature_layers
    drafter.begin(PROMPT)
    drafter.observe(features(layers, 0, 4))
    for bad, message in ((features(layers, 5, 1), "arrived for position 5, expected 4"),
                         (features((0,) * len(layers) if layers != (0,) else (1,), 4, 1), "target features of layers")):
        with pytest.raises(SpecvizError, match=message) as error:
            drafter.observe(bad)
        assert "\n" not in str(error.value)
    with pytest.raises(SpecvizError, match="up to position 3, it needs 8") as error:
        drafter.take(9)
    drafter.follow(PROMPT[:6])
    with pytest.raises(SpecvizError, match="the context changed under") as error:
        drafter.follow([PROMPT[0] + 1, *PROMPT[1:]])


def test_rows_are_taken_once_in_order(drafters):
    drafter = drafters["mtp"]()
    layers = drafter.feature_layers
    drafter.begin(PROMPT)
    first, second = features(layers, 0, 3), features(layers, 3, 2)
    drafter.observe(first)
    drafter.observe(second)
    rows = drafter.take(4)
    torch.testing.assert_close(rows, torch.cat([first.hidden, second.hidden[:1]]).reshape(4, -1))
    assert drafter.take(4) is None
    torch.testing.assert_close(drafter.take(5), second.hidden[1:].reshape(1, -1))
