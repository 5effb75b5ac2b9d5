"""specviz.engine"""
