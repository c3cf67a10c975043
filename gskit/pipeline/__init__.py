"""The ``gskit prepare`` job: recipe steps run in order on one model, with the checks and reports.

``steps``: the step contract (``Pass``, returning ``gskit.passes.transform.PassResult``) and the one
registry of recipe steps (``PASSES``), each step calling a library pass, a backend check or a comparison.
``recipe``: recipe files, validated before anything runs. ``prepare``: runs a recipe and writes the
prepared model and its reports atomically. ``plugin_check``: ``gskit plugin check``, one plugin's rules,
matches and per-plugin comparison on a model, and its stubs.

Layer 3 (docs/architecture.md): may use every layer below; only the CLI sits above.
"""
