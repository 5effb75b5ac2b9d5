"""specviz web app: build the Gradio UI from ``specviz.ui`` and launch it (``python app.py``; on Spaces too)."""

from specviz.ui.app import build_app, launch

demo = build_app()

if __name__ == "__main__":
    launch(demo)
