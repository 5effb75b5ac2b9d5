"""The glossary: every term the app's pages use, in plain words, with its formula where it has one.

Kept as data so the Lesson tab can link each term it prints to its definition (``term``), show the whole list one
click away (``glossary_html``), and a test can check that nothing the pages say is left undefined. Metric formulas
are the ones ``metrics.FORMULAS`` defines, so the glossary and the metric tooltips never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.engine.metrics import FORMULAS
from specviz.viz.text import escape


@dataclass(frozen=True)
class Term:
    """One entry: how the page writes it, what it means in plain words, and its formula ("" where none)."""

    name: str
    plain: str
    formula: str = ""


GLOSSARY: dict[str, Term] = {term.name: term for term in [
    Term("round", "One propose → verify → accept → commit step: the drafter guesses, the target checks every guess "
         "in one forward pass, and the text grows by the guesses it kept plus one token of its own."),
    Term("context", "Every token the target has seen so far: the prompt, then the tokens committed by earlier rounds. "
         "Both the drafter and the target read it."),
    Term("prompt", "The text the run started from, before any token was generated."),
    Term("root", "The last committed token: the draft hangs off it, and it is the first row the target verifies."),
    Term("target", "The model whose output we want, unchanged. It only verifies: one forward pass per round."),
    Term("drafter", "A cheap guesser (a small model, a head on the target, or a text lookup) that proposes the next "
         "few tokens for the target to check."),
    Term("draft", "The drafter's proposal for one round: a chain or a tree of guessed tokens."),
    Term("chain", "A draft of k tokens one after another: each guess follows the one before it."),
    Term("tree", "A draft that branches: several guesses for the same position, each with its own continuation. "
         "The target checks all branches in the same forward."),
    Term("node", "One guessed token in the draft, with its parent (the node it follows; −1 = the root)."),
    Term("depth", "How far a node is from the root: depth 1 follows the last committed token directly."),
    Term("node budget", "The most draft nodes a tree may hold in one round (a chain's budget is its draft length k)."),
    Term("draft length", "k: how many tokens a chain guesses per round."),
    Term("pruned", "Drafted, then cut before verification (over the node budget, or below the drafter's cut): "
         "the target never saw it."),
    Term("q", "The drafter's probability of a node's token, given the tokens before it (q_draft). A lookup drafter "
         "has none: its guess is certain to it (q is a point mass).", "q(x) = P_draft(x | context, path to the "
         "node's parent)"),
    Term("p", "The target's probability of a node's token at that position (p_target), read off the verify forward "
         "at the parent's row.", "p(x) = softmax(logits[parent + 1] / T)[x] (top-p applied where set)"),
    Term("confidence", "What the drafter believes about its guesses: ĉ, its chance that a guess is kept given the "
         "ones before it were. A round records each node's path value, the chance that every guess down to it "
         "survives. Draft models and heads take it from q; DSpark from a trained confidence head.",
         "ĉ(node) = recorded confidence(node) ÷ recorded confidence(parent)"),
    Term("survival", "The chance that every guess up to a position is kept: the product of the per-position "
         "confidences up to it.", "s_k = ĉ_1 × ĉ_2 × … × ĉ_k"),
    Term("verify forward", "The target's one forward pass over the root and every draft node at once; it gives p "
         "at every position, which is why speculation can be cheaper than one forward per token."),
    Term("tree mask", "The attention mask of the verify forward: each node sees the context and its own ancestors, "
         "never its siblings' branches, so one forward scores every branch as if it were alone."),
    Term("verified", "Tokens the target processed in a round's forward: the root plus every draft node.",
         FORMULAS["verified_per_round"]),
    Term("accept rule", "How a round decides which guesses to keep. Every rule here is lossless: the text has the "
         "target's own distribution (greedy: exactly the target's greedy text)."),
    Term("greedy", "Decoding at temperature 0: the target always takes its most likely token, so a guess is kept "
         "exactly when it is the target's argmax.", "accept x ⇔ x = argmax_y p(y)"),
    Term("argmax", "The token with the highest probability at a position."),
    Term("temperature", "T: divides the logits before the softmax. T = 0 is greedy; higher T spreads p out."),
    Term("top-p", "Sampling only from the most likely tokens whose probabilities add up to p; the rest get 0."),
    Term("target sampling", "The rule for drafts that are not random (lookups, argmax chains, top-w trees): the "
         "target draws its own token y ~ p, and the guess that equals y is kept. A guess survives with chance p.",
         "y ~ p(·); accept the child whose token is y; P(accept x) = p(x)"),
    Term("rejection sampling", "The rule for drafts drawn at random from q: keep a guess when a coin u falls below "
         "min(1, p/q). It keeps the target's distribution exactly (Leviathan et al.; for trees, SpecInfer).",
         "accept x ⇔ u < min(1, p(x) / q(x)), u ~ Uniform(0, 1)"),
    Term("coin u", "The uniform random number rejection sampling draws for each test."),
    Term("residual", "What is left of the target's distribution after a rejected guess: the mass where the target "
         "wanted more than the drafter offered. The next sibling, or the correction, is drawn from it.",
         "p′(x) = max(0, p(x) − q(x)) ÷ Σ_y max(0, p(y) − q(y)); q′ = q with the rejected token removed, "
         "renormalised"),
    Term("accepted", "A guess the rule kept: it joins the text as if the target had written it."),
    Term("rejected", "A guess the rule tested and turned down; everything below it is never reached."),
    Term("never reached", "A guess below a rejected one (or a sibling after an accepted one): no test ran on it, "
         "though the forward still computed its p."),
    Term("correction", "The target's own token where the walk stopped at a rejection, so every round adds at least "
         "one token. Greedy: the argmax; sampling: drawn from p or from the residual."),
    Term("bonus", "The target's own token after the last guess when every guess on the path was accepted down to a "
         "leaf: it comes free from the same forward."),
    Term("KV cache", "The target's stored keys and values for every context token, so each forward only computes "
         "the new tokens."),
    Term("cache rollback", "After the accept test the cache drops the entries of every guess that was not kept "
         "(a chain crops its tail; a tree first moves the accepted path next to the prefix), so it holds exactly the "
         "committed tokens again."),
    Term("prefill", "The first forward, over the prompt (all but its last token), that fills the KV cache before "
         "round 1. It is the same work for speculative and plain decoding, so live speedups leave it out."),
    Term("plain decoding", "The target on its own: one forward per token, no drafter. τ = 1 by definition."),
    Term("τ", "Tokens per round: how many tokens each target forward commits on average, the correction or bonus "
         "included.", FORMULAS["tau"]),
    Term("acceptance rate", "The share of all drafted tokens that were kept (every tree node counts as drafted).",
         FORMULAS["acceptance_rate"]),
    Term("α per position", "At each depth d, how often the guess there was kept, given the path reached it: where "
         "acceptance falls off as drafts get longer.", FORMULAS["per_position"]),
    Term("wasted verification", "The share of the target's verified tokens that did not end up in the text: the "
         "price of guessing.", FORMULAS["wasted"]),
    Term("tokens/s", "New tokens per second of generation.", FORMULAS["tokens_per_s"]),
    Term("speedup", "How much faster than plain decoding of the same model on the same machine, measured, never "
         "estimated.", FORMULAS["speedup"]),
    Term("lossless", "The text has exactly the target's own distribution: identical to plain greedy decoding at "
         "T = 0, equal in distribution when sampling."),
    Term("entropy", "How unsure the target is at a position, in nats: 0 when one token takes all the probability.",
         "H = −Σ_x p(x) log p(x)"),
    Term("top-k", "The k most likely tokens at a position, with their probabilities (what a round records of each "
         "distribution)."),
    Term("calibration", "Whether the drafter's confidence matches how often its guesses are really kept.",
         FORMULAS["calibration"]),
    Term("ECE", "Expected calibration error: the average gap between predicted confidence and realised acceptance, "
         "over ten confidence bins weighted by their sizes.",
         "ECE = Σ_bins (n_bin ÷ n) × |mean realised − mean predicted|"),
    Term("reliability diagram", "Predicted confidence against realised acceptance per bin: on the diagonal, the "
         "drafter knows how good its guesses are."),
    Term("verify-cost curve", "How long one target forward takes for n new tokens on this machine, measured once: "
         "it says how many guesses are worth checking."),
]}


def term(name: str, shown: str | None = None) -> str:
    """``shown`` (default: the term itself) as escaped HTML with the definition on hover; ``KeyError`` for a term the
    glossary lacks, so a page cannot print an undefined one."""
    entry = GLOSSARY[name]
    tip = entry.plain + (f" ({entry.formula})" if entry.formula else "")
    return (f'<abbr class="sv-term" data-term="{escape(name)}" title="{escape(tip)}">'
            f"{escape(shown if shown is not None else name)}</abbr>")


def glossary_html() -> str:
    """Every entry as a definition list, formulas in code."""
    rows = []
    for entry in GLOSSARY.values():
        formula = f"<br><code>{escape(entry.formula)}</code>" if entry.formula else ""
        rows.append(f'<dt id="glossary-{escape(_anchor(entry.name))}"><b>{escape(entry.name)}</b></dt>'
                    f"<dd>{escape(entry.plain)}{formula}</dd>")
    return f'<dl class="sv-facts sv-glossary">{"".join(rows)}</dl>'


def _anchor(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())
