"""Which packages the distribution holds; everything else is in pyproject.toml.

The repository's ``plugins/`` folder is installed as the package ``gskit_plugins`` (registered under the
``gskit.plugins`` entry point in pyproject.toml). Its plugin folders are found here on disk, so adding a
plugin folder changes no file outside it; their non-Python files (READMEs, C++ sources, CMake files)
come in through MANIFEST.in.
"""

from setuptools import find_packages, setup

PLUGIN_PACKAGE, PLUGIN_DIR = "gskit_plugins", "plugins"

setup(
    packages=[
        *find_packages(include=["gskit", "gskit.*"]),
        PLUGIN_PACKAGE,
        *(f"{PLUGIN_PACKAGE}.{name}" for name in find_packages(PLUGIN_DIR)),
    ],
    package_dir={PLUGIN_PACKAGE: PLUGIN_DIR},
)
