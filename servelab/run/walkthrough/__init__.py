"""The steps of the lab's measurement notebooks, as tested library code.

The notebooks explain; these modules do the work, so that each notebook cell is a call or two. Every
value a step needs (URLs, how long to wait, where records go) comes from the notebook's parameters
cell, passed in as arguments; nothing here reads notebook globals. Each module's docstring names the
notebooks it serves.
"""
