"""The guided lesson: one round of a real run told step by step in plain words, its formula beside its numbers.

A round is six steps, in the order the engine runs them (``STEPS``): the context; the drafter's proposal with its q
per node; the target's one forward with p per position; each node's accept test with its numbers; the correction or
bonus; the cache rollback. After the last round come the run's totals (``TOTALS``, in ``lesson_totals``). Everything
is read from the ``RunRecord``, so a recorded trace and a live run teach alike. The rules' words (what a rule draws,
which settings give draws) are the rejection debugger's and the metric definitions ``metrics.FORMULAS``, so the
lesson says what the other tabs say. Every term it prints links to the glossary (``glossary.term``); every token's
text is escaped. No Gradio here.
"""

from __future__ import annotations

from collections.abc import Sequence

from specviz.engine.round import Round
from specviz.viz import debugger
from specviz.viz.glossary import term
from specviz.viz.lesson_html import MAX_ROWS, Lesson, more, note, para, subhead, table, tok, tokens_box
from specviz.viz.lesson_html import formula as formula_box
from specviz.viz.lesson_totals import totals
from specviz.viz.outcome import Outcome, node_outcomes
from specviz.viz.record import RunRecord
from specviz.viz.text import escape, fmt_prob, html_token
from specviz.viz.tokens import round_spans

STEPS = ("context", "proposal", "forward", "accept", "extra", "cache")
TOTALS = "totals"
STEP_NAMES = {"context": "the context", "proposal": "the drafter's proposal", "forward": "the target's one forward",
              "accept": "the accept tests", "extra": "correction or bonus", "cache": "the cache rollback",
              TOTALS: "the run's totals"}
#: Context tokens shown before a round (the tail: the draft continues from there).
CONTEXT_TAIL = 40


# ---- where the reader is ------------------------------------------------------------------------------------------
def position(record: RunRecord | None, index, step: str | None) -> tuple[int, str]:
    """``(round, step)`` made valid for ``record``: the round clamped to the run, an unknown step the first one."""
    count = len(record.rounds) if record is not None else 0
    try:
        index = int(index or 0)
    except (TypeError, ValueError):
        index = 0
    step = step if step in (*STEPS, TOTALS) else STEPS[0]
    return max(0, min(index, count - 1)), step


def next_position(record: RunRecord, index, step: str | None) -> tuple[int, str]:
    """The step after ``(index, step)``: the next step of the round, the next round's context, then the totals."""
    index, step = position(record, index, step)
    if step == TOTALS:
        return index, TOTALS
    if step != STEPS[-1]:
        return index, STEPS[STEPS.index(step) + 1]
    return (index + 1, STEPS[0]) if index + 1 < len(record.rounds) else (index, TOTALS)


def previous_position(record: RunRecord, index, step: str | None) -> tuple[int, str]:
    """The step before ``(index, step)``: from the totals back to the last round's rollback."""
    index, step = position(record, index, step)
    if step == TOTALS:
        return max(len(record.rounds) - 1, 0), STEPS[-1]
    if step != STEPS[0]:
        return index, STEPS[STEPS.index(step) - 1]
    return (index - 1, STEPS[-1]) if index > 0 else (0, STEPS[0])


def interesting_rounds(record: RunRecord | None) -> list[tuple[str, int]]:
    """``(label, round)`` for the rounds worth jumping to, one entry per round with every reason it has: the most
    tokens kept, the other tabs' showcase, a rejection in a sampled tree, a sibling tested against the residual, a
    correction drawn from the residual, every guess rejected, a bonus, the biggest tree."""
    rounds = list(record.rounds) if record is not None else []
    if not rounds:
        return []
    reasons: dict[int, list[str]] = {}

    def add(label: str, found: Round | None) -> None:
        if found is not None:
            reasons.setdefault(rounds.index(found), []).append(label)

    def first(test) -> Round | None:
        return next((r for r in rounds if test(r)), None)

    add("most guesses kept", max(rounds, key=lambda r: (len(r.accepted), -r.index)))
    add("the round the other tabs open on", next((r for r in rounds if r.index == record.showcase_index()), None))
    add("a rejection in a sampled tree", first(lambda r: r.rule == "rejection-sampling" and not r.is_chain
                                                and any(not d.get("accepted") and "u" in d for d in r.draws)))
    add("a sibling tested against the residual", first(lambda r: any(_later_sibling(r, d) for d in r.draws)))
    add("a correction drawn from the residual", first(lambda r: r.residual_top is not None))
    add("every guess rejected", first(lambda r: r.tokens and not r.accepted))
    add("a bonus token", first(lambda r: r.tokens and r.extra_kind == "bonus"))
    biggest = max(rounds, key=lambda r: (len(r.tokens), -r.index))
    add("the biggest tree", biggest if not biggest.is_chain else None)
    return [(f"round {i}: {', '.join(labels)}", i) for i, labels in sorted(reasons.items())]


# ---- the steps ---------------------------------------------------------------------------------------------------
def lesson(record: RunRecord | None, index, step: str | None) -> Lesson:
    """The lesson at ``(index, step)`` of ``record`` (clamped to it), or what to do where it has no rounds yet."""
    if record is None or not record.rounds:
        return Lesson("No rounds yet", para("This run has no rounds yet: pick a recorded trace above, or run one in "
                                            "the Playground and come back."), "", "")
    index, step = position(record, index, step)
    if step == TOTALS:
        return totals(record)
    round_ = record.rounds[index]
    title = (f"Round {round_.index} ({len(record.rounds)} rounds, counted from 0) · step {STEPS.index(step) + 1} "
             f"of {len(STEPS)}: {STEP_NAMES[step]}")
    sentence, body, formula = STEP_VIEWS[step](record, index)
    return Lesson(title, sentence, body, formula)


def context_step(record: RunRecord, index: int) -> tuple[str, str, str]:
    """What the round starts from: the prompt and the tokens earlier rounds committed, ending at the root."""
    round_ = record.rounds[index]
    prompt = prompt_length(record)
    root = _root_text(record, index)
    size = (f"holds {prompt + round_.start} tokens: the {prompt}-token {term('prompt')} and {round_.start} "
            "generated by earlier rounds") if prompt else f"holds the prompt and {round_.start} generated tokens"
    sentence = (f"Before round {round_.index}, the {term('context')} {size}. The drafter and the target both read "
                f"it; the guesses will continue from its last token, {tok(root)} (the {term('root')}).")
    if index == 0:
        sentence += (f" The {term('prefill')} already ran the prompt's other tokens through the target once "
                     f"({record.prefill_ms:.0f} ms), filling its {term('KV cache')}.")
    formula = (f"context = prompt + the tokens committed by rounds 0 … {round_.index - 1}" if index else
               "context = the prompt (nothing generated yet)")
    if prompt:
        formula += f"<br>|context| = {prompt} + {round_.start} = {prompt + round_.start} tokens"
    return para(sentence), context_html(record, index), formula_box(formula)


def proposal_step(record: RunRecord, index: int) -> tuple[str, str, str]:
    """The draft: its shape, each node's token, parent, q and confidence, and why the drafter proposed the first."""
    round_ = record.rounds[index]
    n = len(round_.tokens)
    drafter = f"The {term('drafter')} <code>{escape(record.drafter_name)}</code>"
    if not n:
        return (para(f"{drafter} guessed nothing this round, so the target takes one plain step on its own."),
                note("An empty draft: the round is plain decoding."), formula_box("τ of this round = 1"))
    depth = max(round_.depth)
    shape = (f"a {term('chain')} of {n}" if round_.is_chain else
             f"a {term('tree')} of {n} {term('node', 'nodes')}, {depth} deep")
    if round_.q_draft is None:
        how = (f"It computes no {term('q')}: its guesses are certain to it, as a text lookup copies what followed "
               "earlier. To see q, pick a drafter with a model (a draft model or a head).")
    elif round_.sampled:
        how = f"Each guess was drawn at random from its {term('q')}, the drafter's probability for it."
    else:
        how = f"It picked the guesses its {term('q')} ranks highest; q is its probability for each."
    sentence = f"{drafter} guessed {n} token{'s' if n != 1 else ''} as {shape}. {how}"
    pruned = round_.meta.get("pruned")
    if isinstance(pruned, list) and pruned:
        sentence += f" It drafted {len(pruned)} more and cut them before verification ({term('pruned')})."
    confidence = round_.confidence is not None
    rows = []
    for i in range(min(n, MAX_ROWS)):
        rows.append([f"node {i}", _after(round_.parents[i]), str(round_.depth[i]), tok(_text(round_, i)),
                     fmt_prob(_at(round_.q_draft, i))] + ([fmt_prob(_at(round_.confidence, i))] if confidence else []))
    head = ["node", "after", term("depth"), "token", term("q")] + (["path " + term("confidence")] if confidence else [])
    why = debugger.why_proposed(round_, 0, context=context_pieces(record, index), prompt_tokens=prompt_length(record))
    body = table(head, rows) + more(n) + note(f"node 0: {why}")
    if round_.q_draft is None:
        formula = "q: not computed by this drafter (each guess is a point mass, q = 1 for its token)"
    else:
        formula = (f"q(x) = P_draft(x | context, path to the node's parent)<br>node 0: q({tok(_text(round_, 0))}) "
                   f"= {fmt_prob(round_.q_draft[0])}")
        if confidence:
            formula += (f"<br>path confidence = the chance every guess down to the node is kept; node 0: "
                        f"{fmt_prob(round_.confidence[0])}")
    return para(sentence), body, formula_box(formula)


def forward_step(record: RunRecord, index: int) -> tuple[str, str, str]:
    """The target's one forward: how many tokens it verified, p of every node, and the target's own favourite."""
    round_ = record.rounds[index]
    n, verified = len(round_.tokens), round_.verified
    side = int((round_.meta or {}).get("side_rows", 0))
    extra = f" and {side} rows of lookahead's window" if side else ""
    sentence = (f"The {term('target')} ran one {term('verify forward')} over {verified} tokens (the root and the {n} "
                f"guesses{extra}) and read its {term('p')} for every guess at once, in {round_.verify_ms:.1f} ms.")
    if not round_.is_chain:
        sentence += f" The {term('tree mask')} lets each guess see only the guesses it follows."
    if record.greedy:
        sentence += f" Under {term('greedy')} decoding only the {term('argmax')} decides; p is shown to compare."
    rows = []
    for i in range(min(n, MAX_ROWS)):
        row = round_.parents[i] + 1
        best = _at(round_.target_top, row)
        favourite = f"{tok(best[0].text)} ({fmt_prob(best[0].p)})" if best else "—"
        rows.append([f"node {i}", tok(_text(round_, i)), fmt_prob(_at(round_.p_target, i)), favourite])
    body = table(["node", "token", term("p"), "target's own top token there (p)"], rows) + more(n)
    if not n:
        body = note("No guesses: the forward computed only the root's row, like plain decoding.")
    temperature = float((record.header.get("config") or {}).get("temperature", 0.0))
    scale = "" if record.greedy else f" / T, T = {temperature:g}"
    formula = f"p(x) = softmax(logits[row]{scale})[x], read at row = parent + 1 (row 0 = the root)"
    if n:
        formula += (f"<br>node 0 at row 0: p({tok(_text(round_, 0))}) = {fmt_prob(_at(round_.p_target, 0))}"
                    f"<br>{term('verified')} = 1 + {n}{f' + {side}' if side else ''} = {verified} tokens")
    return para(sentence), body, formula_box(formula)


def accept_step(record: RunRecord, index: int) -> tuple[str, str, str]:
    """Each test the accept rule ran, in order, with the numbers it compared."""
    round_ = record.rounds[index]
    n, kept = len(round_.tokens), len(round_.accepted)
    sentence = (f"The drafter guessed {n} token{'s' if n != 1 else ''}; the model kept {kept} and added its own "
                f"({term(round_.extra_kind)}). " + RULE_WORDS.get(round_.rule, f"The rule was {escape(round_.rule)}."))
    unreached = node_outcomes(round_).count(Outcome.UNREACHED)
    if unreached:
        sentence += (f" {unreached} more {'were' if unreached != 1 else 'was'} {term('never reached')}: below a "
                     "rejected guess, or a sibling after a kept one, so no test ran on "
                     f"{'them' if unreached != 1 else 'it'}.")
    if not round_.lossless:
        sentence += " This rule is LOSSY: the text may differ from the target's own."
    rows = [[str(j + 1), _after(d.get("parent", -1)), *_test(round_, d)] for j, d in enumerate(round_.draws)]
    body = table(["test", "at", "candidate", "numbers", "result"], rows) if rows else note(
        "The rule ran no test: there was no guess to judge.")
    return para(sentence), body, formula_box(rule_formula(round_))


def extra_step(record: RunRecord, index: int) -> tuple[str, str, str]:
    """The target's own token (correction or bonus), where it came from, and what the round commits."""
    round_ = record.rounds[index]
    at = round_.accepted[-1] if round_.accepted else -1
    row, token = at + 1, tok(round_.extra_text)
    if round_.extra_kind == "bonus":
        sentence = (f"Every guess on the path was kept down to its end, so the target's own next token there comes "
                    f"free from the same forward: the {term('bonus')} {token}.")
    else:
        source = {"greedy": f"its {term('argmax')}", "target-sampling": "the token it drew, which no guess matched",
                  "rejection-sampling": f"drawn from the {term('residual')}"}.get(round_.rule, "its own choice")
        sentence = (f"The walk stopped at {_after(at)}: no guess there was kept, so the target put in its own token, "
                    f"{source}: the {term('correction')} {token}.")
    committed = "".join(round_spans(round_))
    cut = len(round_.committed) < len(round_.accepted) + 1
    sentence += (f" The round commits {len(round_.committed)} token{'s' if len(round_.committed) != 1 else ''}"
                 + (" (the end of the text or the length limit cut it short)." if cut else "."))
    body = tokens_box(committed)
    p = _p_of(round_, row, round_.extra_token)
    if round_.residual_top:
        body += subhead("the residual it was drawn from, largest entries") + table(
            ["token", term("residual", "p′")], [[tok(c.text), fmt_prob(c.p)] for c in round_.residual_top[:8]])
        formula = (f"correction ~ p′, p′(x) = max(0, p(x) − q(x)) ÷ Σ_y max(0, p(y) − q(y))<br>"
                   f"p′({token}) = {fmt_prob(_choice_p(round_.residual_top, round_.extra_token))}")
    else:
        top = _at(round_.target_top, row) or []
        if top:
            body += subhead(f"the target's top tokens at {_after(at)}") + table(
                ["token", term("p")], [[tok(c.text), fmt_prob(c.p)] for c in top[:8]])
        rule = "= argmax_y p(y)" if round_.rule == "greedy" else "~ p(·)"
        formula = f"{escape(round_.extra_kind)} {rule} at row {row}<br>p({token}) = {fmt_prob(p)}"
    formula += (f"<br>tokens this round = kept + 1 = {len(round_.accepted)} + 1 = {len(round_.accepted) + 1}"
                + (f", cut to {len(round_.committed)}" if cut else ""))
    return para(sentence), body, formula_box(formula)


def cache_step(record: RunRecord, index: int) -> tuple[str, str, str]:
    """The KV cache before, after the forward and after the rollback: the guesses not kept are dropped."""
    round_ = record.rounds[index]
    kept, verified = len(round_.accepted), round_.verified
    dropped = verified - 1 - kept
    how = ("A chain just crops its tail." if round_.is_chain else
           "A tree first moves the kept path's entries next to the earlier ones, then crops.")
    sentence = (f"The forward wrote {verified} entries into the target's {term('KV cache')}. The "
                f"{term('cache rollback')} keeps {1 + kept} (the root and the {kept} kept guesses) and drops "
                f"{dropped}, so the cache again holds exactly the committed tokens. {how} The "
                f"{term(round_.extra_kind)} {tok(round_.extra_text)} has no entry yet: it is the next round's root, "
                "fed at the start of its forward. The drafter is told what was kept and rolls its own state back too.")
    if round_.finished:
        sentence += f" This round ended the run ({escape(record.stop_reason or 'finished')})."
    prompt = prompt_length(record)
    if prompt:
        before = prompt + round_.start - 1
        rows = [["before the round (the context minus its root)", str(before)],
                ["after the forward", f"{before} + {verified} = {before + verified}"],
                ["after the rollback", f"{before} + 1 + {kept} = {before + 1 + kept}"]]
        body = table([f"{term('KV cache')} entries", "count"], rows)
    else:
        body = note("This run's header does not give the prompt's length, so the cache's size is not shown.")
    formula = (f"kept = 1 + accepted = 1 + {kept} = {1 + kept}<br>dropped = {term('verified')} − kept = {verified} − "
               f"{1 + kept} = {dropped}")
    return para(sentence), body, formula_box(formula)


STEP_VIEWS = {"context": context_step, "proposal": proposal_step, "forward": forward_step, "accept": accept_step,
              "extra": extra_step, "cache": cache_step}

#: The rule of a round in one plain sentence (the debugger's ``RULE_TEXT`` is the formal one).
RULE_WORDS = {
    "greedy": f"The {term('greedy')} rule keeps a guess when it is the target's own top token (its "
              f"{term('argmax')}) after the guesses kept before it.",
    "target-sampling": f"The {term('target sampling')} rule lets the target draw its own token from p; the guess "
                       "that equals it is kept, so a guess survives with chance p.",
    "rejection-sampling": f"The {term('rejection sampling')} rule keeps a guess when a {term('coin u')} falls below "
                          f"min(1, p/q); after a rejection the next sibling meets the {term('residual')}.",
}


def rule_formula(round_: Round) -> str:
    """The rule's formula, one test of this round with its numbers, and, where the rule draws no coin, the
    debugger's words for why and which settings give one."""
    coins = [d for d in round_.draws if "u" in d]
    if round_.rule == "rejection-sampling":
        text = ("accept x ⇔ u &lt; min(1, p(x) / q(x)), u ~ Uniform(0, 1)<br>after a rejection: "
                "p′ = norm(max(0, p − q)), q′ = q without the rejected token, renormalised")
        if coins:
            text += "<br>" + _coin_numbers(round_, coins[0])
        return text
    text = {"greedy": "accept x ⇔ x = argmax_y p(y)",
            "target-sampling": "y ~ p(·); accept the child whose token is y; P(accept x) = p(x)"}.get(
        round_.rule, escape(debugger.RULE_TEXT.get(round_.rule, round_.rule)))
    decided = next((d for d in round_.draws if "target_token" in d), None)
    if decided is not None:
        text += f"<br>at {_after(decided.get('parent', -1))}: the target's token {tok(_text_of(round_, decided))}"
    if round_.rule in debugger.NO_COIN:
        text += f"<br><i>{escape(debugger.NO_COIN[round_.rule])}; {escape(debugger.SHOW_DRAWS)}.</i>"
    return text


# ---- one test ------------------------------------------------------------------------------------------------------
def _test(round_: Round, draw: dict) -> list[str]:
    """[candidate, the numbers it was judged on, result] for one of the rule's decisions."""
    node = draw.get("node")
    candidate = f"node {node} {tok(_text(round_, node))}" if node is not None else "—"
    result = "kept" if draw.get("accepted") else "rejected" if node is not None else "none kept"
    if "u" in draw:
        return [candidate, _coin_numbers(round_, draw), result]
    chosen = tok(_text_of(round_, draw))
    verb = "argmax" if round_.rule == "greedy" else "draw"
    if node is None:
        children = [tok(_text(round_, i)) for i, p in enumerate(round_.parents) if p == draw.get("parent", -1)]
        return [f"{len(children)} guess{'es' if len(children) != 1 else ''} ({', '.join(children[:6])}"
                f"{', …' if len(children) > 6 else ''})", f"target's {verb} {chosen} matches none", result]
    return [candidate, f"target's {verb} {chosen} = the guess", result]


def _coin_numbers(round_: Round, draw: dict) -> str:
    """u against min(1, p/q) with the p and q the coin met: the residual's (p′, q′) for a later sibling."""
    later = _later_sibling(round_, draw)
    node = draw.get("node")
    p, q = draw.get("p"), draw.get("q")
    if p is None or q is None:  # older traces: the round's own p and q, or the debugger's rebuilt residual
        test = debugger.sibling_test(round_, node) if later and node is not None else None
        p = test.p if test is not None else _at(round_.p_target, node) if node is not None else None
        q = test.q if test is not None else _at(round_.q_draft, node) if node is not None else None
    mark = "′" if later else ""
    won = "&lt;" if draw.get("accepted") else "≥"
    return (f"u = {fmt_prob(draw.get('u'))} {won} min(1, p{mark}/q{mark}) = min(1, {fmt_prob(p)} / {fmt_prob(q)}) "
            f"= {fmt_prob(draw.get('ratio'))}")


def _later_sibling(round_: Round, draw: dict) -> bool:
    """Whether a coin draw tested a sibling after a rejected one (so it met the residual p′, q′)."""
    if "u" not in draw or draw.get("node") is None:
        return False
    same = [d for d in round_.draws if d.get("parent") == draw.get("parent") and "u" in d and d.get("node") is not None]
    return bool(same) and same[0] is not draw


# ---- the context ----------------------------------------------------------------------------------------------------
def prompt_length(record: RunRecord) -> int | None:
    """The prompt's length in tokens, from the header (None where it records neither ids nor pieces)."""
    prompt = record.header.get("prompt") or {}
    ids = prompt.get("token_ids") if isinstance(prompt, dict) else None
    if isinstance(ids, list) and ids:
        return len(ids)
    return len(record.prompt_pieces) or None


def context_pieces(record: RunRecord, index: int) -> list[str] | None:
    """The display text of every token before round ``index`` (None where the record cannot rebuild it)."""
    prompt = record.prompt_pieces
    if not prompt:
        return None
    pieces = list(prompt)
    for earlier in record.rounds[:index]:
        pieces.extend(earlier.committed_text)
    return pieces if len(pieces) == len(prompt) + record.rounds[index].start else None


def context_html(record: RunRecord, index: int) -> str:
    """The context's last ``CONTEXT_TAIL`` tokens, coloured by provenance like the Playground's text, root ringed."""
    spans = [f'<span class="sv-tok sv-prompt">{html_token(piece)}</span>' for piece in record.prompt_pieces]
    for earlier in record.rounds[:index]:
        spans += round_spans(earlier)
    hidden = max(0, len(spans) - CONTEXT_TAIL)
    shown = spans[hidden:]
    if shown:
        shown[-1] = f'<span class="sv-sel" title="the root">{shown[-1]}</span>'
    else:
        shown = ['<span class="sv-empty">the context is not recorded in this trace</span>']
    elided = f'<span class="sv-elided">[… {hidden} earlier tokens …]</span>' if hidden else ""
    return tokens_box(elided + "".join(shown))


# ---- small helpers ------------------------------------------------------------------------------------------------
def _root_text(record: RunRecord, index: int) -> str:
    if index > 0 and record.rounds[index - 1].committed_text:
        return record.rounds[index - 1].committed_text[-1]
    pieces = record.prompt_pieces
    return pieces[-1] if pieces else "?"


def _text(round_: Round, node: int | None) -> str:
    if node is None:
        return ""
    return round_.text[node] if node < len(round_.text) else f"#{round_.tokens[node]}"


def _text_of(round_: Round, draw: dict) -> str:
    """The display text of the token the target chose at a draw (from its top-k row, the nodes or the extra)."""
    token, row = draw.get("target_token"), draw.get("parent", -1) + 1
    for choice in _at(round_.target_top, row) or []:
        if choice.id == token:
            return choice.text
    for i, t in enumerate(round_.tokens):
        if t == token and round_.parents[i] == row - 1:
            return _text(round_, i)
    return round_.extra_text if token == round_.extra_token else f"#{token}"


def _p_of(round_: Round, row: int, token: int) -> float | None:
    return _choice_p(_at(round_.target_top, row) or [], token)


def _choice_p(choices: Sequence, token: int) -> float | None:
    return next((c.p for c in choices if c.id == token), None)


def _at(values: Sequence | None, i: int | None):
    return values[i] if values is not None and i is not None and 0 <= i < len(values) else None


def _after(parent: int) -> str:
    return "the root" if parent < 0 else f"node {parent}"
