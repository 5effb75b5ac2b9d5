"""Drafter training: shared target features (cached) + one trainer per drafter family.

- ``text_sources``/``prompts``: training text and self-distillation prompts (never the Spec-Bench prompts).
- ``generate``: the target's batched greedy answers with its top-k probabilities.
- ``features``: ``FeatureSet`` (tokens, target top-k, hidden states; ``hidden_states[i]`` = output of layer i-1).
- ``data``: builds and caches train / held-out feature sets; ``batches``/``losses``: shared batching and losses.
- ``trainers``: ``TRAINERS`` registry (``draft-lm`` now; feature-based families plug in with a ``Trainer`` subclass).
- ``cli``: ``train <kind> --target T --data PATH... --out DIR``; ``export``: fp16 + model card for
  ``specviz/assets/models/``.
"""
