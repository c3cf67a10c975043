"""The plugins shipped with gskit, installed as the package ``gskit_plugins``.

Each subfolder holding a ``spec.py`` is one plugin. gskit finds this package through its ``gskit.plugins``
entry point (pyproject.toml) and loads every such subfolder, so a new plugin folder needs no other change.
"""
