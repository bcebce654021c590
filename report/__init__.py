"""Looking at a dataset: statistics, data health, and a self-contained HTML report.

``replaystore.report`` sits above the loaders (it reads episodes the way they do) and below
the tools: ``replaystore report`` and ``replaystore stats`` call it, and so do
``Store.report`` and ``Store._repr_html_``, which load this package by name at their first
call (the store's own modules never import it).
"""
