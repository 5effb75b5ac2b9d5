"""The Gradio app: layout and callbacks (``app``, ``playground``, ``compare``, ``debugger``, ``traces``, ``views``,
``settings``), per-visitor state (``state``), the run controller that starts, steps and stops a visitor's run on
its engine thread (``controller``, no Gradio) and how a callback follows it (``streaming``), and the one module that
runs models (``runner``, with ``zerogpu``). Views come from ``specviz.viz`` and render ``Round`` records only.
"""
