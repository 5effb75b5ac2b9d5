"""specviz.ui"""
