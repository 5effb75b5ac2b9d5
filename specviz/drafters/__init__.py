"""specviz.drafters"""
