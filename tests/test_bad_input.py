"""Bad input gets a clear one-line SpecvizError, before any work is lost."""

import pytest
import tiny

from specviz import api
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig
from specviz.engine.sampling import SamplingConfig
from specviz.errors import SpecvizError, UnsupportedModelError


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert message and "\n" not in message
    return message


@pytest.fixture(scope="module")
def target():
    return tiny.target("llama", 32, layers=1, max_positions=64)


def test_empty_prompt(target):
    for prompt in ("", "   \n"):
        with pytest.raises(SpecvizError) as error:
            target.encode_prompt(prompt, chat=False)
        assert "empty" in one_line(error)
    with pytest.raises(SpecvizError):
        Generation(target, [], GenerationConfig())


@pytest.mark.parametrize("ids, says", [([-1], "prompt token 0 is -1"), ([1, 32], "prompt token 1 is 32"),
                                       ([1.5], "token ids are whole numbers"), (["a"], "token ids are whole numbers"),
                                       ([True], "token ids are whole numbers"), ([], "no token ids")])
def test_prompt_ids_outside_the_vocabulary(target, ids, says):
    with pytest.raises(SpecvizError) as error:
        api.start(target, ids, None)
    assert says in one_line(error)


def test_a_prompt_that_is_not_text_or_not_utf8(target):
    for prompt, says in ((b"hi", "must be text"), ("abc\udcff", "not valid UTF-8")):
        with pytest.raises(SpecvizError) as error:
            target.encode_prompt(prompt, chat=False)
        assert says in one_line(error)


def test_api_calls_with_the_wrong_kind_of_argument(target):
    for call, says in ((lambda: api.load_target(None), "the target must be"),
                       (lambda: api.make_drafter(5, target), "a drafter spec is text"),
                       (lambda: api.make_drafter("ngram", None), "needs the loaded target"),
                       (lambda: api.start(target, [1, 2], "ngram"), "start needs a Drafter")):
        with pytest.raises(SpecvizError) as error:
            call()
        assert says in one_line(error)


@pytest.mark.parametrize("value", [0, -3, 10**6, 2.5])
def test_max_new_tokens_out_of_range(value):
    with pytest.raises(SpecvizError) as error:
        GenerationConfig(max_new_tokens=value)
    assert "max-new-tokens" in one_line(error)


@pytest.mark.parametrize("field, value", [("k", 0), ("k", 33), ("width", 0), ("width", 17), ("depth", 0),
                                          ("depth", 100), ("max_nodes", 0), ("max_nodes", 10_000), ("k", "4"),
                                          ("min_draft_prob", -0.1), ("min_draft_prob", 1.0),
                                          ("min_draft_prob", "0.4"), ("min_draft_prob", True)])
def test_budget_out_of_range(field, value):
    with pytest.raises(SpecvizError) as error:
        DraftBudget(**{field: value})
    assert field.replace("_", "-") in one_line(error)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "7", True])
def test_seed_out_of_range(seed):
    """The engine refuses what the settings refuse (torch would take -1 as 2**64 - 1, and fail on 2**64)."""
    with pytest.raises(SpecvizError) as error:
        GenerationConfig(seed=seed)
    assert "seed" in one_line(error)


@pytest.mark.parametrize("kwargs", [{"temperature": -1.0}, {"temperature": 100.0}, {"temperature": float("nan")},
                                    {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"top_k": "3"}])
def test_sampling_settings_out_of_range(kwargs):
    with pytest.raises(SpecvizError) as error:
        SamplingConfig(**kwargs)
    assert next(iter(kwargs)).replace("_", "-") in one_line(error)


@pytest.mark.parametrize("spec", ["", "hydra", "model:", "ngram:x", "nosuch:foo"])
def test_unknown_drafter(target, spec):
    with pytest.raises(SpecvizError) as error:
        api.make_drafter(spec, target)
    assert "drafter" in one_line(error) or "ngram" in one_line(error)


def test_missing_model_directory(tmp_path):
    with pytest.raises(SpecvizError) as error:
        api.load_target(str(tmp_path / "no-such-model"))
    assert "no-such-model" in one_line(error)


def test_mismatched_tokenizers(target, tmp_path):
    other = tiny.model("llama", 40, layers=1)
    other_tokenizer = tiny.tokenizer(40)
    vocab = other_tokenizer.get_vocab()
    other_tokenizer = tiny.tokenizer_from({f"x{i}": i for i in range(len(vocab))})
    other.save_pretrained(tmp_path / "other")
    other_tokenizer.save_pretrained(tmp_path / "other")
    with pytest.raises(SpecvizError) as error:
        api.make_drafter(f"model:{tmp_path / 'other'}", target)
    message = one_line(error)
    assert target.name in message and "other" in message


def test_prompt_beyond_context_window(target):
    with pytest.raises(SpecvizError) as error:
        Generation(target, list(range(1, 30)) * 3, GenerationConfig(max_new_tokens=4))
    assert "64" in one_line(error)
    with pytest.raises(SpecvizError) as error:
        Generation(target, list(range(1, 30)), GenerationConfig(max_new_tokens=40), api.make_drafter("ngram", target))
    assert "context window" in one_line(error)


def test_sliding_window_model_is_refused():
    net = tiny.model("qwen2", 32, layers=2)
    net.config.use_sliding_window = True
    net.config.sliding_window = 16
    net.config.layer_types = ["sliding_attention"] * 2
    target = api.Target(model=net, tokenizer=tiny.tokenizer(32), name="tiny-sliding")
    with pytest.raises(UnsupportedModelError) as error:
        Generation(target, [1, 2, 3], GenerationConfig(max_new_tokens=40))
    assert "tiny-sliding" in one_line(error) and "sliding window" in one_line(error)
    Generation(target, [1, 2, 3], GenerationConfig(max_new_tokens=8))  # fits in the window: allowed


def test_recurrent_layers_are_refused():
    transformers = pytest.importorskip("transformers")
    config_class = getattr(transformers, "Qwen3NextConfig", None)
    if config_class is None:
        pytest.skip("this transformers has no Qwen3-Next (hybrid linear attention) model")
    config = config_class(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, layer_types=["linear_attention",
                          "full_attention"], linear_num_value_heads=2, linear_num_key_heads=2,
                          linear_key_head_dim=8, linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1,
                          moe_intermediate_size=16, shared_expert_intermediate_size=16)
    net = transformers.AutoModelForCausalLM.from_config(config).eval()
    target = api.Target(model=net, tokenizer=tiny.tokenizer(32), name="tiny-hybrid")
    with pytest.raises(UnsupportedModelError) as error:
        Generation(target, [1, 2, 3], GenerationConfig(max_new_tokens=4))
    assert "tiny-hybrid" in one_line(error)


def test_out_of_vocabulary_draft_is_refused(target):
    class Wild(api.Drafter):
        def propose(self, context, budget, sampling, generator):
            return api.DraftTree.chain([10_000])

    run = Generation(target, [1, 2, 3], GenerationConfig(max_new_tokens=4), Wild())
    with pytest.raises(SpecvizError) as error:
        run.run()
    assert "vocabulary" in one_line(error)


def test_a_draft_beyond_its_budget_is_refused(target):
    """The verify forward and the target's cache are sized by the budget: a drafter that ignores it gets one line
    naming it, not an overflow deep in the cache."""
    class Greedy(api.Drafter):
        name = "greedy-drafter"

        def propose(self, context, budget, sampling, generator):
            return api.DraftTree.chain([1] * (budget.k + 1))

    run = Generation(target, [1, 2, 3], GenerationConfig(max_new_tokens=8), Greedy(), DraftBudget(k=2))
    with pytest.raises(SpecvizError) as error:
        run.run()
    assert "greedy-drafter proposed 3 nodes 3 deep, beyond its budget (chain k=2)" in one_line(error)


def test_a_chain_may_use_a_tree_budgets_nodes_but_not_the_tokens_left():
    """Under a tree budget the depth shapes trees; one chain may hold the whole node budget (its verify costs what the
    tree's does), never more, and never more than the tokens still to generate."""
    budget = DraftBudget(tree=True, width=2, depth=2, max_nodes=5)
    budget.check_fits(api.DraftTree.chain([1] * 5), "lookup")
    for tree, capped in ((api.DraftTree.chain([1] * 6), budget), (api.DraftTree.chain([1] * 4), budget.capped(3)),
                         (api.DraftTree(tokens=[1, 2, 3, 4], parents=[-1, -1, 0, 2]), budget)):
        with pytest.raises(SpecvizError, match="beyond its budget"):
            capped.check_fits(tree, "lookup")
    assert budget.capped(3) == budget.capped(30) == budget and budget.capped(3).longest_chain == 3


@pytest.mark.parametrize("spec, says", [
    ("eagle3:someone/no-such-head", "hub is offline"),
    ("dspark:fixed:someone/no-such-block", "hub is offline"),
    ("hybrid:medusa:someone/no-such-heads", "hub is offline"),
    ("model:someone/no-such-draft", "hub is offline"),
    ("mtp:/no/such/dir", "no such directory, and not a hub id"),
    ("model:/no/such/dir", "no such file or directory"),
    ("model:no-such-name", "unknown model 'no-such-name'"),
])
def test_an_unloadable_drafter_argument_is_refused_before_any_model_loads(spec, says, monkeypatch, tmp_path):
    """The spec parser refuses what cannot load, so a run does not first spend the target's load on it."""
    from specviz.drafters import registry

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(SpecvizError) as error:
        registry.parse(spec)
    assert says in one_line(error)


def _cache_hub_repo(monkeypatch, home, repo: str) -> None:
    """A hub repository in the local cache's layout (refs/main -> snapshots/<commit>/config.json); huggingface_hub
    reads the cache folder from the environment once, at import."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "snapshots" / commit / "config.json").write_text("{}")


def test_a_cached_hub_id_passes_the_check_offline(monkeypatch, tmp_path):
    from specviz.drafters import registry

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _cache_hub_repo(monkeypatch, tmp_path / "hf", "someone/cached-head")
    assert registry.parse("eagle3:someone/cached-head")[1] == "someone/cached-head"
    with pytest.raises(SpecvizError, match="not in the local cache"):
        registry.parse("eagle3:someone/other-head")


def test_the_allowlist_covers_drafter_checkpoints(monkeypatch, tmp_path):
    """A public Space's allowlist names what may load: a head from a path or hub id it does not name is refused;
    the shipped heads (the bare names) are what the operator deployed and pass."""
    from specviz.drafters import registry

    monkeypatch.setenv("SPECVIZ_MODEL_ALLOWLIST", "smollm2-135m,allowed/*")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _cache_hub_repo(monkeypatch, tmp_path / "hf", "someone/cached-head")
    _cache_hub_repo(monkeypatch, tmp_path / "hf", "allowed/head")
    for spec in (f"eagle3:{tmp_path}", "eagle3:someone/cached-head", "hybrid:dflash:someone/cached-head"):
        with pytest.raises(SpecvizError) as error:
            registry.parse(spec)
        assert "is not allowed here" in one_line(error)
    assert registry.parse("eagle3:allowed/head")[1] == "allowed/head"
    assert registry.parse("eagle3")[1] == ""
