"""Training prompts for self-distillation: generated from templates, or read from a prompt file with a held-out part.

The generated ones mimic the *kinds* of request in Spec-Bench (translate, summarise, answer, reason, write, code,
extract) so the drafter sees the target's chat-answer style without any benchmark text. A prompt file (Spec-Bench's
``question.jsonl`` format) adds real requests of the benchmark's distribution; its first prompts per category stay
held out, because those are the ones the benchmark evaluates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from specviz.errors import SpecvizError
from specviz.training.text_sources import Document, code_snippets, passages

LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Chinese", "Japanese", "Russian")
TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "vaccines", "climate change",
    "machine learning", "the Roman Empire", "volcanoes", "the human heart", "electric cars", "the stock market",
    "honey bees", "the printing press", "plate tectonics", "inflation", "the immune system", "solar panels",
    "the Renaissance", "DNA", "rainbows", "the internet", "earthquakes", "democracy", "coffee", "the moon landing",
    "recycling", "sleep", "gravity", "the Great Wall of China", "antibiotics", "compound interest", "tides",
    "the Industrial Revolution", "batteries", "the Olympic Games", "jazz music", "glaciers", "bread baking",
    "public transport", "social media", "meditation", "coral reefs", "the periodic table", "time zones",
    "the theory of evolution", "quantum computers", "the Silk Road", "wind turbines", "the human brain", "hurricanes",
    "the Cold War", "3D printing", "bacteria", "the speed of light", "ancient Egypt", "nuclear power", "rain forests",
    "the Byzantine Empire", "cryptocurrency", "the ozone layer", "vitamins", "the Amazon river", "the Bronze Age",
    "artificial satellites", "desalination", "the Reformation", "supply and demand", "the metric system", "tsunamis",
    "the printing of money", "photosynthetic algae", "the invention of writing", "magnetism", "the Maya civilisation",
    "urban gardening", "the Apollo program", "friction", "the Enlightenment", "minimum wage laws", "migratory birds",
    "the Dead Sea", "antibiotic resistance", "electric guitars", "chess openings", "the human skeleton", "fermentation",
    "the United Nations", "radio waves", "deserts", "the Mongol Empire", "volunteering", "the water footprint of food",
    "the history of the bicycle", "black-and-white photography", "the first computers", "sound waves", "leap years",
)
PEOPLE = ("a pirate captain", "a medieval knight", "a detective", "a friendly robot", "a museum guide", "a chef",
          "a space explorer", "a wise old teacher", "a sports coach", "a travel agent", "a park ranger",
          "a startup founder", "a librarian", "a ship's doctor", "a fashion designer", "a lighthouse keeper")
PLACES = ("Paris", "Tokyo", "a small mountain village", "the Sahara desert", "New York", "Iceland", "Rome",
          "a rainforest", "the Moon", "an old lighthouse", "Cairo", "a Scottish island", "Buenos Aires",
          "a space station")
#: how a standalone request asks to be answered (empty: as it stands)
FRAMINGS = ("", "", "", " Answer in three bullet points.", " Explain it to a ten-year-old.",
            " Keep it under 100 words.", " Give one concrete example.", " Be detailed and precise.")
ITEMS = ("apples", "books", "marbles", "pencils", "cookies", "stickers", "oranges", "tickets", "coins", "shells")
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jia", "Kofi", "Lena", "Maya", "Omar")
CODE_TASKS = (
    "checks whether a string is a palindrome", "returns the n-th Fibonacci number", "merges two sorted lists",
    "counts the words in a text", "removes duplicates from a list while keeping order", "finds the largest element "
    "of a list without using max()", "reverses a linked list", "computes the factorial of a number",
    "checks whether a number is prime", "flattens a nested list", "converts Celsius to Fahrenheit",
    "returns the most common character in a string", "implements binary search", "validates an email address",
    "reads a CSV file and sums a column", "computes the average of a list of numbers",
)


@dataclass(frozen=True)
class Prompt:
    """A user turn and its category (used to balance and to report per-category agreement)."""

    category: str
    text: str


def math_problem(rng: random.Random) -> str:
    """A short arithmetic word problem with fresh numbers."""
    a, b, c = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    forms = (
        f"{name} has {a} {item}. {other} gives {name} {b} more, then {name} shares them equally among {c} friends. "
        f"How many {item} does each friend get, and how many are left over?",
        f"A shop sells {item} at ${c} each. {name} buys {a} and pays with ${a * c + b}. How much change does "
        f"{name} get?",
        f"{name} reads {b} pages a day. The book has {a * b + c} pages. How many days does it take to finish it?",
        f"A train travels at {a + 20} km per hour for {c} hours and then {b} km more. How far does it go in total?",
        f"If {c} workers build a wall in {b} days, how long would {c * 2} workers take, working at the same rate?",
        f"Solve for x: {c}x + {a} = {c * b + a}. Show your steps.",
        f"What is {a}% of {b * 20}? Explain how you got the answer.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    )
    return rng.choice(forms)


def _from_passage(rng: random.Random, passage: str) -> Prompt:
    kind = rng.choice(("summarization", "summarization", "rag", "rag", "translation", "extraction", "writing"))
    if kind == "summarization":
        ask = rng.choice(("Summarize the following text in a few sentences.", "Write a one-paragraph summary of this "
                          "passage.", "Give a short summary of the text below.", "Summarize the key points:"))
        return Prompt(kind, f"{ask}\n\n{passage}")
    if kind == "rag":
        ask = rng.choice(("Based on the passage above, who are the main characters and what do they want?",
                          "According to the text, what happens first and what happens next?",
                          "Using only the passage, describe the setting.", "What is the main event in this passage?",
                          "Answer from the text: how does the main character feel, and why?"))
        return Prompt(kind, f"{passage}\n\n{ask}")
    if kind == "translation":
        sentences = [s.strip() for s in passage.replace("\n", " ").split(". ") if 6 <= len(s.split()) <= 30]
        sentence = (rng.choice(sentences) if sentences else passage[:200]).rstrip(".") + "."
        return Prompt(kind, f"Translate the following sentence into {rng.choice(LANGUAGES)}: {sentence}")
    if kind == "extraction":
        ask = rng.choice(("List every character named in this text.", "Extract the places mentioned in the text "
                          "as a bulleted list.", "Return a JSON object with the keys 'characters' and 'objects' "
                          "for the text below."))
        return Prompt(kind, f"{ask}\n\n{passage}")
    return Prompt(kind, f"Continue this story for a few more paragraphs, in the same style:\n\n{passage}")


def _standalone(rng: random.Random) -> Prompt:
    topic, person, place = rng.choice(TOPICS), rng.choice(PEOPLE), rng.choice(PLACES)
    kind = rng.choice(("qa", "qa", "stem", "humanities", "writing", "roleplay", "reasoning", "coding", "math_reasoning",
                       "math_reasoning"))
    if kind == "math_reasoning":
        return Prompt(kind, math_problem(rng))
    if kind == "coding":
        return Prompt(kind, f"Write a Python function that {rng.choice(CODE_TASKS)}. Explain how it works.")
    templates = {
        "qa": (f"What is {topic}?", f"Can you explain {topic} in simple terms?", f"Why is {topic} important?",
               f"Tell me three interesting facts about {topic}."),
        "stem": (f"Explain the science behind {topic}.", f"How does {topic} work? Give an example.",
                 f"What are the main causes and effects of {topic}?"),
        "humanities": (f"Discuss the history of {topic}.", f"How has {topic} changed society?",
                       f"What are the arguments for and against {topic}?"),
        "writing": (f"Write a short poem about {topic}.", f"Write a blog post about a trip to {place}.",
                    f"Write a persuasive paragraph about why people should learn about {topic}.",
                    f"Write a short story set in {place}."),
        "roleplay": (f"Pretend you are {person}. Introduce yourself and describe your day.",
                     f"Act as {person} and give advice to someone visiting {place}.",
                     f"You are {person} in {place}. A stranger asks you about {topic}. Reply in character.",
                     f"Stay in character as {person} and tell a short tale about {place}."),
        "reasoning": (f"What would happen if {topic} suddenly disappeared? Think it through step by step.",
                      f"Compare {topic} and {rng.choice(TOPICS)}: how are they similar and different?"),
    }
    return Prompt(kind, rng.choice(templates[kind]) + rng.choice(FRAMINGS))


def _from_code(rng: random.Random, snippet: str) -> Prompt:
    ask = rng.choice(("Explain what this Python function does:", "Add comments to this code and explain it:",
                      "Is there a bug in this function? Review it:", "Write unit tests for this function:"))
    return Prompt("coding", f"{ask}\n\n```python\n{snippet}\n```")


def build_prompts(documents: list[Document], count: int, *, seed: int = 0) -> list[Prompt]:
    """``count`` distinct prompts: about 45% over prose passages, 10% over code, 45% standalone templates."""
    rng = random.Random(seed)
    prose = [p for d in documents if d.kind == "prose" for p in passages(d)]
    code = [s for d in documents if d.kind == "code" for s in code_snippets(d)]
    seen: set[str] = set()
    out: list[Prompt] = []
    attempts = 0
    while len(out) < count and attempts < count * 20:
        attempts += 1
        roll = rng.random()
        if roll < 0.45 and prose:
            prompt = _from_passage(rng, rng.choice(prose))
        elif roll < 0.55 and code:
            prompt = _from_code(rng, rng.choice(code))
        else:
            prompt = _standalone(rng)
        if prompt.text not in seen:
            seen.add(prompt.text)
            out.append(prompt)
    return out


def file_prompts(path: str, holdout_per_category: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out) first-turn prompts of a Spec-Bench-style ``question.jsonl``.

    The first ``holdout_per_category`` prompts of each category (file order) are held out: exactly the ones
    ``specviz bench --limit-per-category N`` evaluates for any N up to it, so training never sees them.
    """
    from specviz.bench.prompts import load_prompts  # the bench's reader, so both sides parse the file alike

    if holdout_per_category < 0:
        raise SpecvizError(f"prompt-file holdout must be 0 or more, got {holdout_per_category}")
    train: list[Prompt] = []
    held: list[Prompt] = []
    seen: dict[str, int] = {}
    for record in load_prompts(path):
        rank = seen[record.category] = seen.get(record.category, 0) + 1
        (held if rank <= holdout_per_category else train).append(Prompt(record.category, record.text))
    return train, held
