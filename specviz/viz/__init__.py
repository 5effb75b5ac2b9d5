"""specviz.viz"""
