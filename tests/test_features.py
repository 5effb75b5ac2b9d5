"""Target features for drafters: every committed position's hidden states, from the forwards that already ran."""

import pytest
import tiny
import torch

from specviz.drafters.draft_model import DraftModelDrafter
from specviz.engine import features
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig
from specviz.engine.sampling import SamplingConfig
from specviz.errors import SpecvizError

VOCAB = 64
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
LAYERS = 3


class Recording(DraftModelDrafter):
    """A real draft model (so drafts are partly rejected) that records the features the engine hands it."""

    feature_layers = (0, 2, LAYERS)  # embeddings, a middle layer's output, the final norm's output

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[int, torch.Tensor] = {}
        self.calls: list[tuple[int, int]] = []

    def observe(self, found: features.TargetFeatures) -> None:
        assert found.layers == self.feature_layers
        self.calls.append((found.start, len(found)))
        for row in range(len(found)):
            assert found.start + row not in self.seen, "a position was observed twice"
            self.seen[found.start + row] = found.hidden[row].clone()


@pytest.mark.parametrize("arch, forward", [("llama", "hf"), ("qwen2", "hf"), ("llama", "fast")])
@pytest.mark.parametrize("budget", [DraftBudget(k=4), DraftBudget(tree=True, width=3, depth=3, max_nodes=9)],
                         ids=["chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_drafter_receives_hidden_states_of_every_committed_position(arch, forward, budget, temperature):
    target = tiny.target(arch, VOCAB, forward=forward, layers=LAYERS, scale=25)
    drafter = Recording(tiny.truncated(tiny.model(arch, VOCAB, layers=LAYERS, scale=25), 1), VOCAB,
                        stochastic_tree=True)
    config = GenerationConfig(max_new_tokens=40, sampling=SamplingConfig(temperature=temperature), seed=3)
    run = Generation(target, PROMPT, config, drafter, budget).run()
    assert any(len(r.accepted) < len(r.tokens) for r in run.rounds), "no draft was rejected: the test is too easy"
    full = PROMPT + run.token_ids
    # every position but the newest, each exactly once (the newest too when it was a verified draft node, i.e. the
    # token budget cut the round's bonus or correction)
    assert sorted(drafter.seen) in (list(range(len(full) - 1)), list(range(len(full))))
    assert drafter.calls[0] == (0, len(PROMPT) - 1)  # the prefill's rows come first
    reference = tiny.model(arch, VOCAB, layers=LAYERS, scale=25)
    with torch.inference_mode():
        states = reference(torch.tensor([full]), output_hidden_states=True).hidden_states
    expected = torch.stack([states[i][0] for i in Recording.feature_layers], dim=1)
    got = torch.stack([drafter.seen[p] for p in sorted(drafter.seen)])
    expected = expected[: len(got)]
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()


def test_no_layers_no_hooks():
    """A drafter that reads no features leaves the target's forwards untouched (no hooks, no captured tensors)."""
    net = tiny.model("llama", VOCAB, layers=2)
    with features.capture(net, ()) as found:
        assert not any(m._forward_hooks for m in net.modules())
        net(torch.tensor([PROMPT]))
    assert found == {}
    with features.capture(net, (1,)):
        assert sum(len(m._forward_hooks) for m in net.modules()) == 1
    assert not any(m._forward_hooks for m in net.modules())  # removed on exit


def test_missing_layer_is_one_line_error():
    target = tiny.target("llama", VOCAB, layers=2)
    drafter = Recording(tiny.model("llama", VOCAB, layers=1), VOCAB)  # declares hidden_states[3]; there are 0..2
    with pytest.raises(SpecvizError, match=r"hidden-state layers \[3\] do not exist"):
        Generation(target, PROMPT, GenerationConfig(max_new_tokens=4), drafter, DraftBudget(k=2))


def test_a_capture_records_only_its_own_threads_forwards():
    """The app's sessions share one target: a forward run by another thread (another session's run, with hooks of
    its own) must not overwrite this run's captured rows."""
    import threading

    net = tiny.model("llama", VOCAB, layers=2)
    mine, theirs = torch.tensor([PROMPT]), torch.tensor([PROMPT[:4]])
    opened, forwarded = threading.Event(), threading.Event()
    captured: dict[str, dict] = {}

    def other_session():
        with features.capture(net, (1,)) as found:
            opened.set()
            forwarded.wait(10)
            with torch.inference_mode():
                net(theirs)
            captured["theirs"] = dict(found)

    thread = threading.Thread(target=other_session)
    with features.capture(net, (1,)) as found:
        thread.start()
        assert opened.wait(10)
        with torch.inference_mode():
            net(mine)
        forwarded.set()
        thread.join(10)
        assert found[1].shape[0] == len(PROMPT)  # still this thread's forward, not the other's 4 rows
    assert captured["theirs"][1].shape[0] == 4
