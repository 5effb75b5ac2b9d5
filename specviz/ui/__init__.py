"""The Gradio app: layout and callbacks (``app``, ``playground``, ``compare``, ``debugger``, ``traces``, ``views``,
``settings``), per-session state and the engine thread (``state``, ``streaming``), and the one module that runs
models (``runner``, with ``zerogpu``). Views come from ``specviz.viz`` and render ``Round`` records only.
"""
