"""Test setup: one intra-op thread (tiny models are dominated by thread hand-offs), no hub access, and the timings
runs keep (``specviz.engine.timings``) in a folder of this session's own, not the user's cache."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("SPECVIZ_TIMINGS_DIR", tempfile.mkdtemp(prefix="specviz-test-timings-"))

import torch  # noqa: E402

torch.set_num_threads(1)
