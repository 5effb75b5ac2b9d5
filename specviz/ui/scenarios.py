"""The Playground's lesson scenarios: each a prompt, a drafter and a shape that show one idea, the recorded run the
page opens it on, and one paragraph on what to look for.

A scenario names its recording by the recorder's own terms (``examples.SHAPES``, ``examples.trace_name``), so its
settings and its trace come from one place: what Run runs live is what was recorded, and
``tests/test_scenarios.py`` checks every trace's header against its scenario. Missing traces are recorded with
``python -m specviz.ui.examples record --categories C --drafters D --shapes S`` (``recording_command``).
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz import settings as declared
from specviz.ui import examples, runner
from specviz.ui import settings as panel
from specviz.viz.record import RunRecord

#: The length the shipped traces were recorded at: short enough to record and replay quickly.
RECORDED_TOKENS = 64


@dataclass(frozen=True)
class Scenario:
    """One lesson: a Spec-Bench prompt (by category), a drafter spec and a recorded shape (``examples.SHAPES``)."""

    key: str
    title: str
    category: str
    drafter: str
    shape: str
    look_for: str
    max_new_tokens: int = RECORDED_TOKENS

    @property
    def question_id(self) -> str:
        return next(str(row["question_id"]) for row in examples.prompts() if row["category"] == self.category)

    @property
    def prompt(self) -> str:
        return examples.prompt_text(self.question_id)

    @property
    def settings(self) -> dict:
        """The declared run settings this scenario sets (the rest keep their defaults)."""
        return {"max_new_tokens": self.max_new_tokens, **examples.SHAPES[self.shape]}

    @property
    def temperature(self) -> float:
        return float(self.settings.get("temperature", declared.default("temperature")))

    @property
    def trace(self) -> str:
        """The recorded trace the scenario opens on (a file under ``examples.TRACES``)."""
        return examples.trace_name(self.category, self.drafter, self.shape)

    def request(self) -> runner.RunRequest:
        """What Run runs live: the recorded settings on the default target, checked as the panel checks them."""
        return runner.RunRequest(prompt=self.prompt, drafter=self.drafter, **self.settings).validate()

    def values(self) -> list:
        """The Playground panel's values for ``request`` (``settings.INPUT_NAMES`` order)."""
        return panel.values_for(self.request())

    def recorded(self) -> RunRecord:
        return examples.load_trace(self.trace)

    def recording_command(self) -> str:
        return (f"python -m specviz.ui.examples record --categories {self.category} --drafters {self.drafter} "
                f"--shapes {self.shape} --max-new-tokens {self.max_new_tokens}")


DRAFT_MODEL = "model:smollm2-135m-draft"

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "lookup-copies", "1 · Prompt lookup copies its input", "summarization", "ngram", "chain",
        "Prompt lookup has no model: it finds the text's last few words earlier in the text and proposes what "
        "followed them there. A summary repeats its article, so the green (accepted) runs in the text panel are "
        "phrases lifted from the article. Step through the rounds with ← and →: where the summary leaves the "
        "article's wording, the chain is turned down at its first token, or there is no match and the round adds "
        "one token of the target's own. *Why was it rejected?* quotes the match each draft was copied from, and "
        "the speedup card shows what copying is worth when drafting costs nothing."),
    Scenario(
        "weak-drafter", "2 · A weak drafter: prompt lookup on code", "coding", "ngram", "chain",
        "The same lookup on a prompt that asks for new code. The answer copies little from the question, so most "
        "rounds find nothing to copy and propose nothing, and most of the rest are turned down at the first "
        "token: τ (tokens per round, in the metrics) stays close to 1, which is plain decoding's. The "
        "per-position acceptance chart shows how rarely a chain gets past its first token. Scenario 3 runs a "
        "draft model on the same prompt."),
    Scenario(
        "strong-drafter", "3 · A stronger drafter: a draft model on the same code", "coding", DRAFT_MODEL, "chain",
        "A small draft model (six layers, distilled from the target's own answers) guesses every token from what "
        "it learned rather than from the prompt, so it keeps proposing where lookup had nothing to copy, and τ is "
        "higher than in scenario 2. Each guess costs a forward pass of the draft model: the draft part of the "
        "time-per-round chart is its price, and the speedup card says whether the extra accepted tokens paid "
        "for it on this machine."),
    Scenario(
        "chain-vs-tree", "4 · The same drafter as a tree", "coding", DRAFT_MODEL, "tree",
        "The draft model of scenario 3, now proposing up to 3 alternatives per step, 16 nodes a round in all. "
        "The target checks every branch in one forward pass and the accept rule keeps the longest branch it "
        "agrees with, so a wrong first guess no longer ends the round when a sibling was right: τ beats the "
        "chain's. The price is in the metrics: verified per round and wasted verification grow, and on a CPU "
        "every extra node makes the verify pass slower. Faded, dotted nodes were drafted and cut to the node "
        "budget before the target saw them. The *Chain vs Tree* tab runs this chain and this tree live, one after "
        "the other, and says which was faster."),
    Scenario(
        "greedy-vs-sampling", "5 · Sampling changes the accept rule", "coding", DRAFT_MODEL, "chain-sampled",
        "Scenario 3's chain at temperature 0.7. Under greedy decoding a draft survives when it is the target's "
        "most likely token. Now both models sample, and a draft that the drafter gave probability q and the "
        "target p is accepted with probability min(1, p/q), by a random coin: rejection sampling. The round "
        "summary names the rule, each node's hover shows p, q and min(1, p/q), and *Why was it rejected?* shows "
        "the coin u against it. After a rejection the correction is drawn from what the draft left of the "
        "target's distribution, so the text is distributed exactly as the target's own sampling."),
    Scenario(
        "dspark-cut", "6 · DSpark's confidence cuts its block", "summarization", "dspark", "chain-long",
        "DSpark drafts a whole block of tokens in one forward pass, and its confidence head predicts how likely "
        "each prefix of the block is to survive. It verifies only the prefix with the most expected tokens per "
        "millisecond on this machine's verify-cost curve. The drafter-confidence panel shows the round's block: "
        "each position's q, confidence ĉ and survival s, the cut ℓ, and the curves behind it; in the tree the "
        "tail after the cut is faded, never verified. The reliability diagram beside it checks the confidence "
        "against what the target really accepted."),
    Scenario(
        "draft-too-long", "7 · A draft too long for this machine", "coding", DRAFT_MODEL, "chain-long",
        "The draft model drafting 12 tokens a round. Acceptance falls with every position (the per-position "
        "chart), so the last guesses rarely survive, yet each costs a draft-model forward and widens the verify "
        "pass. The *theory vs measurement* panel prices every draft length γ on this machine's measured verify "
        "cost and this run's drafting time: the star is the best γ, far short of 12, and the diamond is this "
        "run's measured speedup, below the curve's peak. Set the draft length to the star's γ and press Run to "
        "measure that length live."),
)

BY_KEY: dict[str, Scenario] = {scenario.key: scenario for scenario in SCENARIOS}


def available() -> list[Scenario]:
    """The scenarios whose recorded trace is shipped (all of them in this checkout: the tests say so)."""
    return [scenario for scenario in SCENARIOS if (examples.TRACES / scenario.trace).is_file()]


def choices() -> list[tuple[str, str]]:
    """(title, key) for the picker."""
    return [(scenario.title, scenario.key) for scenario in available()]
