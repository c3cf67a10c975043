"""The ``gskit prepare`` job: recipe steps run in order on one model, with the checks and reports.

``steps``: the one registry of recipe steps (``PASSES``): the library's passes and the checks
(``check_trt``, ``validate``, ``build``), every one a ``gskit.passes.transform.GraphPass``.
``recipe``: recipe files, validated before anything runs. ``prepare``: runs a recipe and writes the
prepared model and its reports atomically; ``outdir``: OUTDIR's lock and work folder; ``report_page``:
what report.html shows. ``plugin_check``: ``gskit plugin check``, one plugin's rules,
matches and per-plugin comparison on a model, and its stubs.

Layer 3 (docs/architecture.md): may use every layer below; only the CLI sits above.
"""
